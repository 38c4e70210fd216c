"""A grammar judge nobody here wrote: CMU link-grammar (Debian ``python3-link-grammar`` and
``link-grammar-dictionaries-en``, installed by ``scripts/setup.sh``).

A reply is grammatical when every sentence in it has a complete linkage with no null links
(``min_null_count = max_null_count = 0``). Human-written caller lines score about 98 % by
this rule; it knows nothing of this project's models, so a model cannot win it with broken
text.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from llm.quality import sentences

DEBIAN_PYTHON = Path("/usr/lib/python3/dist-packages")


class JudgeUnavailable(RuntimeError):
    pass


class LinkGrammarJudge:
    def __init__(self, max_parse_s: int = 5) -> None:
        try:
            import linkgrammar as lg  # noqa: F401
        except ImportError:
            if str(DEBIAN_PYTHON) not in sys.path:
                sys.path.append(str(DEBIAN_PYTHON))  # Debian's binding lives outside the venv
            try:
                import linkgrammar as lg  # noqa: F401
            except ImportError as exc:
                raise JudgeUnavailable(
                    "link-grammar is not installed (Debian python3-link-grammar and link-grammar-dictionaries-en; "
                    "scripts/setup.sh installs them)") from exc
        self._lg = lg
        self._dict = lg.Dictionary("en")
        self._opts = lg.ParseOptions(min_null_count=0, max_null_count=0, max_parse_time=max_parse_s, verbosity=0)
        self._lock = threading.Lock()  # one parser state; parses are short

    def sentence_ok(self, sentence: str) -> bool:
        with self._lock:
            linkages = self._lg.Sentence(sentence, self._dict, self._opts).parse()
            return next(iter(linkages), None) is not None

    def grammatical(self, text: str) -> bool:
        sents = sentences(text)
        return bool(sents) and all(self.sentence_ok(s) for s in sents)

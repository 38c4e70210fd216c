"""Mark the training replies a caller could follow: every sentence parses under link-grammar
(no null links), no word, word pair or sentence said twice, at most 24 words.

    python scripts/filter_replies.py        # about 7 minutes on one core

Writes ``llm/corpus/grammatical_replies.txt.gz``: one short hash per kept reply text
(`llm.data.reply_key`), not the text itself, so the corpora's own licences are untouched;
``llm.train --grammatical`` trains only on pairs whose reply is in it.
"""

from __future__ import annotations

import gzip
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llm.data import GRAMMATICAL_REPLIES, all_pairs, reply_key, sgd_pairs  # noqa: E402
from llm.grammar_judge import LinkGrammarJudge  # noqa: E402
from llm.quality import repeats, words  # noqa: E402

MAX_WORDS = 24


def main() -> None:
    judge = LinkGrammarJudge()
    texts = list(dict.fromkeys(p.response for p in all_pairs(1234) + sgd_pairs()))
    t0 = time.monotonic()
    keep = []
    for i, t in enumerate(texts):
        if len(words(t)) <= MAX_WORDS and not repeats(t) and judge.grammatical(t):
            keep.append(reply_key(t))
        if i % 20000 == 0:
            print(f"{i}/{len(texts)} {time.monotonic() - t0:.0f} s, kept {len(keep)}", flush=True)
    with gzip.GzipFile(GRAMMATICAL_REPLIES, "wb", mtime=0) as f:
        f.write(("\n".join(sorted(set(keep))) + "\n").encode())
    print(f"kept {len(keep)} of {len(texts)} replies -> {GRAMMATICAL_REPLIES.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

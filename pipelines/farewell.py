"""Does a line close the conversation? The caller's "Thanks, bye." and the agent's "Have a good
day." do; "Bye, wait, can you check my order?" does not.

`turn.end_call_on_goodbye` hangs up once the caller has said goodbye and the agent's reply to it
was a goodbye too (docs/turn-taking.md). The embedded LM calls no tools, so the closing is read
from the words: a short list of English leave-taking phrases, and no question, since a line that
asks something expects an answer.
"""

from __future__ import annotations

import re

# leave-taking phrases, as lower-case words
FAREWELLS: tuple[tuple[str, ...], ...] = tuple(tuple(p.split()) for p in (
    "bye", "goodbye", "good bye", "bye bye", "farewell", "good night", "see you", "see ya",
    "talk to you later", "take care", "that's all", "that is all", "that'll be all", "that will be all",
    "nothing else", "have a good day", "have a great day", "have a nice day", "have a wonderful day",
    "have a lovely day", "have a good one", "have a great one", "have a nice one", "have a good evening",
    "have a nice evening", "have a good night", "have a great night", "have a good weekend",
    "have a great weekend", "have a nice weekend", "enjoy your day", "enjoy the rest of your day",
))
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def is_farewell(text: str) -> bool:
    """``text`` takes leave (one of `FAREWELLS`, as whole words) and asks nothing."""
    if "?" in text:
        return False
    words = _WORD.findall(text.lower().replace("\u2019", "'"))
    return any(_has(words, phrase) for phrase in FAREWELLS)


def _has(words: list[str], phrase: tuple[str, ...]) -> bool:
    n = len(phrase)
    return any(tuple(words[i : i + n]) == phrase for i in range(len(words) - n + 1))

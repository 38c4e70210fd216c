"""Does a line end the agent's part of the call? A goodbye: the caller's "Thanks, bye." and the
agent's "Have a good day." do; "Bye, wait, can you check my order?" does not. A handoff: the
agent's "I'm handing you over to a colleague now." does.

`turn.end_call_on_goodbye` hangs up once the caller has said goodbye and the agent's reply to it
was a goodbye too; `turn.transfer_to` transfers the call once the agent's reply said it hands
the caller over (docs/turn-taking.md). The embedded LM calls no tools, so these are read from
the words: short lists of English phrases, and no question, since a line that asks something
expects an answer.
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
# the agent handing the caller over to a person
HANDOFFS: tuple[tuple[str, ...], ...] = tuple(tuple(p.split()) for p in (
    "transfer you", "transferring you", "handing you over", "hand you over", "put you through",
    "putting you through", "connect you to", "connect you with", "connecting you to", "connecting you with",
    "pass you to", "passing you to", "pass you over", "passing you over",
))
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def is_farewell(text: str) -> bool:
    """``text`` takes leave (one of `FAREWELLS`, as whole words) and asks nothing."""
    return _says(text, FAREWELLS)


def is_handoff(text: str) -> bool:
    """``text`` says the caller is being handed over to someone (one of `HANDOFFS`) and asks
    nothing ("Shall I transfer you?" is not a handoff yet)."""
    return _says(text, HANDOFFS)


def _says(text: str, phrases: tuple[tuple[str, ...], ...]) -> bool:
    if "?" in text:
        return False
    words = _WORD.findall(text.lower().replace("\u2019", "'"))
    return any(_has(words, phrase) for phrase in phrases)


def _has(words: list[str], phrase: tuple[str, ...]) -> bool:
    n = len(phrase)
    return any(tuple(words[i : i + n]) == phrase for i in range(len(words) - n + 1))

"""End-of-turn prediction: how much silence to wait before the caller's turn is over.

A fixed silence timeout is either slow (0.5 s in most frameworks) or cuts people off when
they pause mid-sentence. Here the wait depends on how complete the transcript looks:

- ends with terminal punctuation or a complete-sounding word: ``min_silence_ms``;
- ends with a function word, a filler or a comma ("for", "the", "and", "um", ","):
  ``incomplete_silence_ms``;
- no hypothesis yet: halfway between;
- the language model's probability that the words make a whole turn (`llm.turn_end`) moves
  the cases that punctuation and function words leave open;
- the caller's own pause history stretches the waits when they often go on after a pause that
  looked like the end (``adapt_to_caller``), bounded by ``max_silence_ms``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipelines.config import TurnConfig

# Words after which an English sentence almost never ends (articles, most prepositions and
# conjunctions, possessives, subject pronouns, fillers). Words that often end one ("thank
# you", "I love it", "than he was", "I think so", "yes I can") are not here: for those the
# punctuation and the LM's turn-end probability decide. "in" and "on" stay, although "come in"
# ends a sentence: cutting a caller off costs more than a longer wait.
INCOMPLETE_WORDS = frozenset(
    """a an the and or but because if for of to in on at by with from as than which whose whom while
    unless although whether into onto my your his their our its i he she we they be been um uh er erm hmm
    mm um-hmm like just very gonna wanna""".split()
)
_WORD = re.compile(r"[A-Za-z'-]+")


def completeness(text: str, lm_prob: float | None = None) -> float:
    """0 = clearly unfinished, 1 = looks finished, 0.5 = no evidence.

    ``lm_prob`` is the language model's probability that the words make a whole turn
    (`llm.turn_end`, which ignores punctuation). It cannot overrule a trailing function word,
    a comma or a question mark; otherwise an unsure LM makes the turn wait (below 0.45 longer
    than the middle ground, below 0.3 nearly as long as after a function word: Whisper puts a
    full stop after fragments too), and from 0.7 a turn without punctuation counts as
    finished."""
    c = _surface_completeness(text)
    if lm_prob is None or c <= 0.1 or text.strip().endswith(("?", "!")):
        return c
    if lm_prob < 0.3:
        return min(c, 0.25)  # the words read as a fragment: nearly the wait of a function word
    if lm_prob < 0.45:
        return min(c, 0.6)
    if lm_prob >= 0.7:
        return 1.0
    return c


def _surface_completeness(text: str) -> float:
    t = text.strip()
    if not t:
        return 0.5
    if t.endswith(("...", "…", ",", ";", ":", "-", "—")):
        return 0.0
    if t.endswith(("?", "!")):
        return 1.0
    words = _WORD.findall(t.lower())
    if words and words[-1] in INCOMPLETE_WORDS:
        return 0.1
    if t.endswith("."):
        return 1.0
    return 0.7


@dataclass
class Endpointer:
    cfg: TurnConfig
    # pauses (ms) after which this caller went on speaking, most recent last
    resumed_pauses: list[float] = field(default_factory=list)

    def required_silence_ms(self, text: str | None, stale: bool = False, lm_prob: float | None = None) -> float:
        """``stale``: ``text`` may not cover the end of the turn, so it cannot prove completion.
        ``lm_prob``: the LM's probability that ``text`` is a whole turn, if known."""
        c = completeness(text or "", lm_prob)
        if stale:
            c = min(c, 0.7)
        lo, hi = self.cfg.min_silence_ms, self.cfg.incomplete_silence_ms
        wait = hi - c * (hi - lo)
        lm_sure = lm_prob is not None and lm_prob >= 0.7
        if self.cfg.adapt_to_caller and self.resumed_pauses and c >= 0.7 and not lm_sure:
            # a caller who keeps pausing briefly and going on gets a little more room
            recent = sorted(self.resumed_pauses[-8:])
            p75 = recent[int(0.75 * (len(recent) - 1))]
            wait = max(wait, min(p75 + 40.0, 0.5 * (lo + hi)))
        return min(wait, float(self.cfg.max_silence_ms))

    def caller_resumed_after(self, pause_ms: float, text: str | None = None, lm_prob: float | None = None) -> None:
        """The caller went on speaking after ``pause_ms`` of silence (not a turn end), and
        ``text`` was the hypothesis then. Only pauses that could have ended the turn count: at
        least ``min_silence_ms`` long, after a hypothesis that looked complete. A pause after
        "to the" that the caller resumed says nothing about their complete-looking pauses, and
        the short dips between words would stretch every wait."""
        if pause_ms < max(self.cfg.min_silence_ms, 1):
            return
        if text is not None and completeness(text, lm_prob) < 0.7:
            return
        self.resumed_pauses.append(pause_ms)

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

# Words after which an English sentence almost never ends.
INCOMPLETE_WORDS = frozenset(
    """a an the and or but so because if for of to in on at by with from as than that which who whose
    whom where when while my your his her their our its is are was were be been am i you we they he she
    it this these those um uh er erm hmm like just very really gonna wanna would could should will can
    about into onto over under after before since until unless though although whether not no also
    then maybe um-hmm mm""".split()
)
_WORD = re.compile(r"[A-Za-z'-]+")


def completeness(text: str, lm_prob: float | None = None) -> float:
    """0 = clearly unfinished, 1 = looks finished, 0.5 = no evidence.

    ``lm_prob`` is the language model's probability that the words make a whole turn
    (`llm.turn_end`, which ignores punctuation). It cannot overrule a trailing function word,
    a comma or a question mark; otherwise a confident LM decides: below 0.3 the turn waits
    longer than the middle ground (Whisper puts a full stop after fragments too), from 0.7 a
    turn without punctuation counts as finished."""
    c = _surface_completeness(text)
    if lm_prob is None or c <= 0.1 or text.strip().endswith(("?", "!")):
        return c
    if lm_prob < 0.3:
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
        if self.cfg.adapt_to_caller and self.resumed_pauses and c >= 0.7:
            # a caller who keeps pausing briefly and going on gets a little more room
            recent = sorted(self.resumed_pauses[-8:])
            p75 = recent[int(0.75 * (len(recent) - 1))]
            wait = max(wait, min(p75 + 40.0, 0.5 * (lo + hi)))
        return min(wait, float(self.cfg.max_silence_ms))

    def caller_resumed_after(self, pause_ms: float, text: str | None = None) -> None:
        """The caller went on speaking after ``pause_ms`` of silence (not a turn end), and
        ``text`` was the hypothesis then. Only pauses that could have ended the turn count: at
        least ``min_silence_ms`` long, after a hypothesis that looked complete. A pause after
        "to the" that the caller resumed says nothing about their complete-looking pauses, and
        the short dips between words would stretch every wait."""
        if pause_ms < max(self.cfg.min_silence_ms, 1):
            return
        if text is not None and completeness(text) < 0.7:
            return
        self.resumed_pauses.append(pause_ms)

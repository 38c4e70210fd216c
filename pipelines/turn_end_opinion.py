"""The LM's turn-end probability for each hypothesis of a call, computed once, off the loop.
Words whose ending the LM cannot overrule (a question mark, a trailing function word or comma)
get none: the endpoint need not wait for it.

The endpointer asks on every frame of a pause; the probe (`Responder.turn_end_prob`, a torch
forward) runs once per distinct hypothesis in a worker thread, and ``on_ready`` is called when
it lands so the endpoint can be decided at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pipelines.endpointing import lm_can_move
from voice.asr import normalize_words
from voice.workers import workers_of

log = logging.getLogger(__name__)


def _key(text: str) -> str:
    return " ".join(normalize_words(text))


class TurnEndOpinions:
    def __init__(
        self,
        responder: Callable[[], Any],
        enabled: bool,
        spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]],
        on_ready: Callable[[], None],
    ) -> None:
        self._responder = responder  # looked up per call: the engines may be swapped
        self._enabled = enabled
        self._spawn = spawn
        self._on_ready = on_ready
        self._probs: dict[str, float | None] = {}
        self._pending: set[str] = set()

    def get(self, text: str) -> tuple[bool, float | None]:
        """(known, probability) that ``text`` is a whole turn. Not known yet: the computation
        is started (once) and ``on_ready`` follows. Without a probe it is known: None."""
        responder = self._responder()
        if not self._enabled or getattr(responder, "turn_end", None) is None:
            return True, None  # a responder without a probe has no opinion
        if not lm_can_move(text):
            return True, None  # a question, a trailing "the" or comma: the words decide alone
        fn: Callable[[str], float | None] = responder.turn_end_prob
        key = _key(text)
        if key in self._probs:
            return True, self._probs[key]
        if key not in self._pending:
            self._pending.add(key)

            async def compute() -> None:
                try:
                    self._probs[key] = await workers_of(responder).run(fn, text)
                except Exception:
                    log.exception("turn-end probe failed; deciding without it")
                    self._probs[key] = None
                finally:
                    self._pending.discard(key)
                self._on_ready()

            self._spawn(compute())
        return False, None

    def peek(self, text: str | None) -> float | None:
        """The probability if it was already computed (never starts a computation)."""
        return self._probs.get(_key(text)) if text else None

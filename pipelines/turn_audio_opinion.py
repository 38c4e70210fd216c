"""Smart Turn's opinion of each pause of a call: is the caller done, by the sound of it?

Asked once per pause, when the VAD reports it, on the turn's audio so far (the silence after
the last word included, as the model was trained); the model (`voice.smart_turn`, ~50 ms)
runs in a worker thread and ``on_ready`` is called when it lands, so the endpoint can be
decided at once. A pause the caller ends by speaking again gets a new opinion at the next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from voice.workers import workers_of

log = logging.getLogger(__name__)


class TurnAudioOpinions:
    def __init__(
        self,
        model: Callable[[], Any],
        spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]],
        on_ready: Callable[[], None],
    ) -> None:
        self._model = model  # looked up per call: the engines may be swapped
        self._spawn = spawn
        self._on_ready = on_ready
        self._probs: dict[float, float | None] = {}

    def ask(self, pause_t: float, audio: Callable[[], np.ndarray]) -> None:
        """Start the opinion of the pause that began at ``pause_t`` (call time), once."""
        model = self._model()
        if model is None or pause_t in self._probs:
            return
        self._probs[pause_t] = None
        pcm = audio()  # copied now, on the loop: the buffers move on

        async def compute() -> None:
            try:
                x = pcm.astype(np.float32) / 32768.0
                self._probs[pause_t] = await workers_of(model).run(model.predict, x)
            except Exception:
                log.exception("Smart Turn failed; deciding on the words alone")
                self._probs[pause_t] = float("nan")
            self._on_ready()

        self._spawn(compute())

    def get(self, pause_t: float) -> tuple[bool, float | None]:
        """(known, probability that the turn is over) for the pause that began at ``pause_t``.
        Without a model it is known: None. A failed inference is known: None."""
        if self._model() is None:
            return True, None
        p = self._probs.get(pause_t)
        if p is None:
            return False, None
        return True, None if p != p else p  # NaN: the model failed

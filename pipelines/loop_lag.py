"""Event-loop lag: how late a timer fires. When the loop runs late, every call on it hears
its replies late, so this is the overload signal that admission reads."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque


class LoopLagMonitor:
    """Sleeps `interval_s` in a loop and remembers how much later than asked it woke, over the
    last `window_s` seconds."""

    def __init__(self, window_s: float = 2.0, interval_s: float = 0.05) -> None:
        self.window_s = window_s
        self.interval_s = interval_s
        self._samples: deque[tuple[float, float]] = deque()
        self._task: asyncio.Task[None] | None = None

    def ensure_running(self) -> None:
        """Start measuring on the running loop (idempotent; restarts on a new loop)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        self._samples.clear()
        self._task = loop.create_task(self._run(), name="loop-lag")

    def worst_ms(self) -> float:
        self._trim(time.monotonic())
        # a loop blocked right now has not logged its late wake-up yet: count the wait so far
        pending = 0.0
        if self._samples:
            pending = time.monotonic() - self._samples[-1][0] - self.interval_s
        return max([lag for _, lag in self._samples] + [pending * 1000, 0.0])

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            self._samples.append((now, max(0.0, (now - t0 - self.interval_s) * 1000)))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()

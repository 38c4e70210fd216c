"""Worker threads for one engine: a bounded pool, and how many of its jobs wait.

Every model call runs off the event loop. By default (``threads=None``) it goes to asyncio's
default executor, which every engine and every call share; with ``threads=n`` the engine gets
its own pool of n threads, so a queue of Whisper passes cannot hold back Piper's first audio.
`waiting` (jobs handed over but not started) is the queue depth that admission reads.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class EngineWorkers:
    def __init__(self, name: str, threads: int | None = None) -> None:
        self.name = name
        self.threads = threads
        self._executor = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"engine-{name}") if threads else None
        )
        self._lock = threading.Lock()
        self.waiting = 0
        self.running = 0

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker thread (with the caller's context, like
        `asyncio.to_thread`); cancelling the awaiter does not stop a job already running."""
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        with self._lock:
            self.waiting += 1
        started = abandoned = False

        def job() -> T | None:
            nonlocal started
            with self._lock:
                if abandoned:  # its awaiter was cancelled before it started: skip it
                    return None
                self.waiting -= 1
                self.running += 1
                started = True
            try:
                return call()
            finally:
                with self._lock:
                    self.running -= 1

        fut = asyncio.get_running_loop().run_in_executor(self._executor, job)
        try:
            return await fut  # type: ignore[return-value]
        finally:
            if fut.cancelled():
                with self._lock:
                    if not started:
                        abandoned = True
                        self.waiting -= 1

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


SHARED = EngineWorkers("shared")  # asyncio's default executor, for engines not given a pool


def workers_of(engine: Any) -> EngineWorkers:
    return getattr(engine, "workers", None) or SHARED

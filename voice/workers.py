"""Worker threads for one engine: a bounded pool, its queue in order of urgency, and how many
of its jobs wait.

Every model call runs off the event loop. By default (``threads=None``) it goes to asyncio's
default executor, which every engine and every call share, first come first served; with
``threads=n`` the engine gets its own pool of n threads, so a queue of Whisper passes cannot
hold back Piper's first audio. A pool's queue is ordered by priority, then arrival: a job a
caller is waiting on (``NOW``: a final transcript, a pause's hypothesis, a first clause) starts
before the work that only runs ahead of them (``AHEAD``: a partial while they still speak, a
reply's later clauses), whichever call either belongs to. `waiting` (jobs handed over but not
started) is the queue depth that admission reads.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

NOW = 0  # somebody is waiting on it
AHEAD = 1  # work done ahead of need: it may wait behind any NOW job


@dataclass
class _Job:
    call: Callable[[], Any]
    fut: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    started: bool = False
    abandoned: bool = False  # its awaiter was cancelled before it started: never run it


@dataclass
class _Queue:
    """The pool's own threads and its priority queue (guarded by ``cv``)."""

    threads: int
    name: str
    cv: threading.Condition = field(default_factory=threading.Condition)
    heap: list[tuple[int, int, _Job]] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=itertools.count)
    workers: list[threading.Thread] = field(default_factory=list)
    closed: bool = False


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():  # cancelled meanwhile
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class EngineWorkers:
    def __init__(self, name: str, threads: int | None = None) -> None:
        self.name = name
        self.threads = threads
        self._q = _Queue(threads, f"engine-{name}") if threads else None
        self._lock = threading.Lock()  # the shared executor's counters (a pool counts under its queue's lock)
        self.waiting = 0
        self.running = 0

    async def run(self, fn: Callable[..., T], /, *args: Any, priority: int = NOW, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker thread (with the caller's context, like
        `asyncio.to_thread`). ``priority`` (`NOW`, `AHEAD`) orders the pool's queue; the
        shared executor has no order but arrival. Cancelling the awaiter before the job
        started means it never runs; a job already running is not stopped."""
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kwargs)
        if self._q is None:
            return await self._run_shared(call)
        loop = asyncio.get_running_loop()
        job = _Job(call, loop.create_future(), loop)
        q = self._q
        with q.cv:
            if q.closed:
                raise RuntimeError(f"the {self.name} workers are shut down")
            heapq.heappush(q.heap, (priority, next(q.seq), job))
            self.waiting += 1
            if not q.workers:  # started with the first job
                for i in range(q.threads):
                    t = threading.Thread(target=self._work, name=f"{q.name}_{i}", daemon=True)
                    q.workers.append(t)
                    t.start()
            q.cv.notify()
        try:
            return await job.fut  # type: ignore[no-any-return]
        finally:
            if job.fut.cancelled():
                with q.cv:
                    if not job.started and not job.abandoned:
                        job.abandoned = True
                        self.waiting -= 1

    def _work(self) -> None:
        q = self._q
        assert q is not None
        while True:
            with q.cv:
                while not q.heap and not q.closed:
                    q.cv.wait()
                if q.closed:
                    return
                job = heapq.heappop(q.heap)[2]
                if job.abandoned:
                    continue
                job.started = True
                self.waiting -= 1
                self.running += 1
            result: Any = None
            exc: BaseException | None = None
            try:
                result = job.call()
            except BaseException as e:  # handed to the awaiter, as an executor would
                exc = e
            finally:
                with q.cv:
                    self.running -= 1
            try:
                job.loop.call_soon_threadsafe(_settle, job.fut, result, exc)
            except RuntimeError:
                pass  # the awaiter's loop is closed: nobody is left to tell
            # an idle thread holds nothing of its last job (its arguments may hold a whole call)
            del job, result, exc

    async def _run_shared(self, call: Callable[[], T]) -> T:
        with self._lock:
            self.waiting += 1
        started = abandoned = False

        def job() -> T | None:
            nonlocal started
            with self._lock:
                if abandoned:
                    return None
                self.waiting -= 1
                self.running += 1
                started = True
            try:
                return call()
            finally:
                with self._lock:
                    self.running -= 1

        fut = asyncio.get_running_loop().run_in_executor(None, job)
        try:
            return await fut  # type: ignore[return-value]
        finally:
            if fut.cancelled():
                with self._lock:
                    if not started:
                        abandoned = True
                        self.waiting -= 1

    def shutdown(self) -> None:
        """Stop the pool's threads once their current job ends; jobs still queued are cancelled."""
        q = self._q
        if q is None:
            return
        with q.cv:
            q.closed = True
            pending = [job for _, _, job in q.heap if not job.abandoned]
            for job in pending:
                job.abandoned = True
            q.heap.clear()
            self.waiting -= len(pending)
            q.cv.notify_all()
        for job in pending:
            try:
                job.loop.call_soon_threadsafe(job.fut.cancel)
            except RuntimeError:
                pass


SHARED = EngineWorkers("shared")  # asyncio's default executor, for engines not given a pool


def workers_of(engine: Any) -> EngineWorkers:
    return getattr(engine, "workers", None) or SHARED

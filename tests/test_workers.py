"""`voice.workers.EngineWorkers`: a bounded pool per engine and its queue depth (no models)."""

from __future__ import annotations

import asyncio
import threading
import time

from voice.workers import SHARED, EngineWorkers, workers_of


async def test_a_pool_runs_at_most_its_threads_at_once_and_counts_who_waits() -> None:
    pool = EngineWorkers("asr", 2)
    gate = threading.Event()
    names: list[str] = []

    def job(i: int) -> int:
        names.append(threading.current_thread().name)
        gate.wait(5)
        return i * 10

    tasks = [asyncio.ensure_future(pool.run(job, i)) for i in range(5)]
    await asyncio.sleep(0.2)
    assert (pool.running, pool.waiting) == (2, 3)
    gate.set()
    assert await asyncio.gather(*tasks) == [0, 10, 20, 30, 40]
    assert (pool.running, pool.waiting) == (0, 0)
    assert {n.rsplit("_", 1)[0] for n in names} == {"engine-asr"}
    pool.shutdown()


async def test_a_job_cancelled_before_it_starts_never_runs_and_stops_waiting() -> None:
    pool = EngineWorkers("tts", 1)
    gate = threading.Event()
    ran: list[str] = []
    first = asyncio.ensure_future(pool.run(lambda: (gate.wait(5), ran.append("first"))))
    second = asyncio.ensure_future(pool.run(lambda: ran.append("second")))
    await asyncio.sleep(0.1)
    assert pool.waiting == 1
    second.cancel()
    await asyncio.sleep(0.05)
    assert pool.waiting == 0
    gate.set()
    await first
    time.sleep(0.1)
    assert ran == ["first"]
    pool.shutdown()


def test_an_engine_without_a_pool_uses_the_shared_executor() -> None:
    class Bare:
        pass

    assert workers_of(Bare()) is SHARED and SHARED.threads is None

"""`voice.workers.EngineWorkers`: a bounded pool per engine and its queue depth (no models)."""

from __future__ import annotations

import asyncio
import threading
import time

from voice.workers import AHEAD, NOW, SHARED, EngineWorkers, workers_of


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


async def test_a_pool_starts_what_a_caller_waits_on_before_work_done_ahead() -> None:
    pool = EngineWorkers("asr", 1)
    gate = threading.Event()
    order: list[str] = []
    busy = asyncio.ensure_future(pool.run(gate.wait, 5))
    await asyncio.sleep(0.1)
    ahead = [asyncio.ensure_future(pool.run(order.append, f"partial {i}", priority=AHEAD)) for i in range(2)]
    await asyncio.sleep(0.01)
    final = asyncio.ensure_future(pool.run(order.append, "final", priority=NOW))
    await asyncio.sleep(0.05)
    assert pool.waiting == 3
    gate.set()
    await asyncio.gather(busy, final, *ahead)
    assert order == ["final", "partial 0", "partial 1"]  # by urgency, then in order of arrival
    pool.shutdown()


async def test_a_job_failing_in_a_pool_raises_in_its_awaiter_and_the_pool_goes_on() -> None:
    pool = EngineWorkers("llm", 1)

    def boom() -> None:
        raise ValueError("bad input")

    try:
        await pool.run(boom)
    except ValueError as e:
        assert str(e) == "bad input"
    else:
        raise AssertionError("the job's error was not raised")
    assert await pool.run(sum, [1, 2]) == 3
    assert (pool.running, pool.waiting) == (0, 0)
    pool.shutdown()


async def test_shutdown_cancels_the_queued_jobs_and_refuses_new_ones() -> None:
    pool = EngineWorkers("tts", 1)
    gate = threading.Event()
    first = asyncio.ensure_future(pool.run(gate.wait, 5))
    await asyncio.sleep(0.05)
    queued = asyncio.ensure_future(pool.run(sum, [1]))
    await asyncio.sleep(0.05)
    pool.shutdown()
    await asyncio.sleep(0.05)
    assert queued.cancelled() and pool.waiting == 0
    gate.set()
    assert await first is True
    try:
        await pool.run(sum, [1])
    except RuntimeError as e:
        assert "shut down" in str(e)
    else:
        raise AssertionError("a shut-down pool took a job")


async def test_an_idle_thread_holds_nothing_of_its_last_job() -> None:
    """A job's arguments (a call's callbacks, and through them the call) are freed once it has
    run, not when the thread's next job comes."""
    import gc
    import weakref

    class Call:  # stands for a session a job's callback refers to
        pass

    pool = EngineWorkers("llm", 1)
    call = Call()
    gone = weakref.ref(call)
    result = await pool.run(lambda c: 42, call)
    del call
    await asyncio.sleep(0.05)
    gc.collect()
    assert result == 42 and gone() is None
    pool.shutdown()

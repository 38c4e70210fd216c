"""Admission: one capacity for every transport of an agent, and 503 while the loop lags.
No models: the `Admission` is the real one, on its own."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.admission import Admission, CapacityConfig, Seat
from pipelines.config import ConfigError, parse_config
from pipelines.serve_livekit import CallLoad, build_server
from voice.transports.base import Refusal


async def test_seats_up_to_capacity_then_busy_and_a_released_seat_is_free_again() -> None:
    adm = Admission(CapacityConfig(max_calls=2))
    a, b = adm.admit("sip"), adm.admit("webrtc")  # two transports, one count
    assert isinstance(a, Seat) and isinstance(b, Seat) and adm.live == 2
    refused = adm.admit("sip")
    assert isinstance(refused, Refusal) and refused.busy and refused.retry_after_s == 5
    assert "2 calls in progress (max 2)" in refused.detail
    a.release()
    a.release()  # idempotent: a seat given back twice frees one place
    assert adm.live == 1 and isinstance(adm.admit("webrtc"), Seat)
    await adm.aclose()


async def test_a_replayed_call_is_counted_but_never_refused() -> None:
    adm = Admission(CapacityConfig(max_calls=1))
    first, second = adm.take("replay"), adm.take("replay")
    assert adm.live == 2 and adm.load() == 2.0
    assert isinstance(adm.admit("sip"), Refusal)
    first.release()
    second.release()
    assert adm.live == 0


async def test_a_lagging_event_loop_refuses_new_calls_as_overloaded_then_recovers() -> None:
    adm = Admission(CapacityConfig(overload_lag_ms=50, overload_window_s=0.5, retry_after_s=7))
    assert isinstance(adm.admit("sip"), Seat)
    await asyncio.sleep(0.2)
    time.sleep(0.3)  # what a model run on the event loop would do to every call
    refused = adm.admit("sip")
    assert isinstance(refused, Refusal) and not refused.busy and refused.retry_after_s == 7
    assert "event loop lagged" in refused.detail
    await asyncio.sleep(0.8)  # the lag leaves the window
    assert isinstance(adm.admit("sip"), Seat)
    await adm.aclose()


async def test_deep_engine_queues_refuse_new_calls() -> None:
    depth = 0
    adm = Admission(CapacityConfig(overload_queue=3), queue_depth=lambda: depth)
    assert isinstance(adm.admit("sip"), Seat)
    depth = 4
    refused = adm.admit("sip")
    assert isinstance(refused, Refusal) and not refused.busy and "4 engine jobs waiting" in refused.detail
    await adm.aclose()


def test_capacity_settings_are_validated_and_name_the_key() -> None:
    assert parse_config({"agent": {"max_calls": 6}}).agent.max_calls == 6
    with pytest.raises(ConfigError, match="agent.max_calls"):
        parse_config({"agent": {"max_calls": 0}})
    with pytest.raises(ConfigError, match="agent.overload_lag_ms"):
        parse_config({"agent": {"overload_lag_ms": -1}})
    with pytest.raises(ConfigError, match="sip.max_calls"):
        parse_config({"sip": {"max_calls": 0}})


class _Jobs:
    """Stands in for livekit-agents' AgentServer: only what a load function reads."""

    def __init__(self, n: int) -> None:
        self.active_jobs = [object()] * n


def test_livekit_load_is_live_calls_over_capacity_and_full_at_capacity() -> None:
    load = CallLoad(4)
    assert [load(_Jobs(n)) for n in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    # the server marks the worker full when load >= threshold: at 4 calls, not at 3
    assert load(_Jobs(3)) < load.threshold <= load(_Jobs(4)) and load.threshold < 1.0


def test_livekit_worker_gets_our_load_function_and_threshold() -> None:
    cfg = parse_config({"agent": {"max_calls": 3}, "livekit": {"url": "ws://127.0.0.1:7880"}})
    server = build_server(cfg)
    assert isinstance(server.load_fnc, CallLoad) and server.load_fnc.max_calls == 3
    assert server._load_threshold == pytest.approx(2.5 / 3)

"""Prometheus metrics from bus events, scraped over real HTTP from prometheus-client's server.

The real replayed call is checked against its report in tests/test_mqtt_e2e.py.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.events import Dtmf, EventBus, Interrupt, Resume, SessionEnd, SessionStart, TurnCompleted, Violation
from pipelines.metrics import start_metrics_server


class FakeAgent:
    def __init__(self) -> None:
        self.bus = EventBus()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def turn(index: int, gap: float, stages: dict, spec: dict | None = None) -> dict:
    return {"index": index, "gap_ms": gap, "stages": stages, "speculation": spec or {"used": False, "hit": False}}


async def test_metric_names_and_values_from_turn_events() -> None:
    agent = FakeAgent()
    drops = [0]
    server = start_metrics_server(agent, 0, drop_sources={"mqtt": lambda: drops[0]})
    try:
        bus = agent.bus
        bus.emit(SessionStart("a", 0.0, transport="sip"))
        bus.emit(SessionStart("b", 0.0, transport="webrtc"))
        s1 = {"vad_endpoint": 80.0, "asr_final": 30.0, "llm_block": 55.0, "llm_steps": 6, "tts_first_audio": 25.0}
        s2 = {"vad_endpoint": 120.0, "asr_final": 10.0, "llm_block": 20.0, "llm_steps": 3, "tts_first_audio": 30.0}
        bus.emit(TurnCompleted("a", 4.5, report=turn(0, 210.0, s1, {"used": True, "hit": False})))
        bus.emit(Violation("a", 4.5, stage="llm_block", budget_ms=40, actual_ms=55, over_ms=15, turn=0))
        bus.emit(TurnCompleted("a", 9.0, report=turn(1, 180.0, s2, {"used": True, "hit": True})))
        bus.emit(TurnCompleted("a", 12.0, report={"index": 2, "stages": {}}))  # no reply: counted, no latencies
        bus.emit(TurnCompleted("b", 3.0, report=turn(0, 150.0, s2, {"used": True, "hit": True})))
        bus.emit(Interrupt("a", 10.0, turn=1, heard_text="sure"))
        bus.emit(Interrupt("a", 10.5, turn=1, heard_text="sure"))
        bus.emit(Resume("a", 11.0, turn=1, text="Sure, I can help."))  # the second had no words
        bus.emit(Dtmf("a", 11.0, digit="5"))
        bus.emit(SessionEnd("b", 5.0, reason="transferred", turns=1))
        bus.emit(SessionEnd("b", 5.1, reason="transferred", turns=1))  # said twice: counted once
        drops[0] = 7

        m = await asyncio.to_thread(scrape, server.url)
        sip = (("transport", "sip"),)
        assert m[("voice_agent_turns_total", sip)] == 3
        assert m[("voice_agent_e2e_latency_seconds_count", sip)] == 2
        assert m[("voice_agent_e2e_latency_seconds_sum", sip)] == pytest.approx(0.39)
        assert m[("voice_agent_end_of_turn_delay_seconds_sum", sip)] == pytest.approx(0.2)
        assert m[("voice_agent_transcription_delay_seconds_sum", sip)] == pytest.approx(0.04)
        assert m[("voice_agent_llm_ttft_seconds_sum", sip)] == pytest.approx(0.075)
        assert m[("voice_agent_tts_ttfb_seconds_sum", sip)] == pytest.approx(0.055)
        assert m[("voice_agent_llm_steps_sum", sip)] == 9
        # 210 ms falls in the 0.3 s bucket, not the 0.2 s one
        assert m[("voice_agent_e2e_latency_seconds_bucket", (("le", "0.2"), *sip))] == 1
        assert m[("voice_agent_e2e_latency_seconds_bucket", (("le", "0.3"), *sip))] == 2
        assert m[("voice_agent_budget_violations_total", (("stage", "llm_block"), *sip))] == 1
        assert m[("voice_agent_speculations_total", (("result", "hit"), *sip))] == 1
        assert m[("voice_agent_speculations_total", (("result", "miss"), *sip))] == 1
        assert m[("voice_agent_speculation_hit_rate", ())] == pytest.approx(2 / 3)
        assert m[("voice_agent_interruptions_total", sip)] == 2
        assert m[("voice_agent_false_interruptions_total", sip)] == 1
        assert m[("voice_agent_dtmf_digits_total", sip)] == 1
        assert m[("voice_agent_turns_total", (("transport", "webrtc"),))] == 1
        assert m[("voice_agent_sessions_total", sip)] == 1
        assert m[("voice_agent_sessions_active", ())] == 1
        assert m[("voice_agent_sessions_ended_total", (("reason", "transferred"), ("transport", "webrtc")))] == 1
        assert m[("voice_agent_events_dropped_total", (("sink", "mqtt"),))] == 7
    finally:
        server.close()


async def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError, match="cannot listen on 127.0.0.1"):
            start_metrics_server(FakeAgent(), s.getsockname()[1])


async def test_odd_reports_do_not_break_counting() -> None:
    agent = FakeAgent()
    server = start_metrics_server(agent, 0)
    try:
        agent.bus.emit(TurnCompleted("x", 1.0, report={"stages": {"llm_block": "slow", "llm_steps": None}}))
        agent.bus.emit(TurnCompleted("x", 2.0, report={"gap_ms": True, "speculation": None}))
        m = await asyncio.to_thread(scrape, server.url)
        assert m[("voice_agent_turns_total", (("transport", "unknown"),))] == 2
        assert ("voice_agent_llm_ttft_seconds_count", (("transport", "unknown"),)) not in m
    finally:
        server.close()


async def test_servers_start_metrics_only_when_configured() -> None:
    from pipelines.config import MetricsConfig
    from pipelines.metrics import start_metrics

    assert start_metrics(FakeAgent(), MetricsConfig()) is None
    server = start_metrics(FakeAgent(), MetricsConfig(prometheus_port=0))
    assert server is not None
    try:
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(server.url, timeout=5).read().decode())
        assert "voice_agent_e2e_latency_seconds" in text and "voice_agent_turns_total" in text
    finally:
        server.close()

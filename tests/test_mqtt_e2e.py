"""A real call through the real Agent, with a real mosquitto, Prometheus and the timeline.

One scenario (the agent loads once): three recorded utterances replayed as one call, the
second barging in on the reply to the first, then a live session driven only by MQTT
control messages. The tests check what came out of it:
the turn events on the broker, the metric values against the call report, the control
replies and their effect on the session, and the timeline picture of the call.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.config import AgentConfig
from pipelines.metrics import start_metrics_server
from pipelines.mqtt import start_mqtt
from pipelines.transport import AudioClock
from tests.mosquitto import Collector, running_mosquitto
from tests.speech import librivox
from tests.test_report_view import check_png

agent_available = importlib.util.find_spec("pipelines.agent") is not None and (
    importlib.util.find_spec("pipelines.replay") is not None
)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.peer,
    pytest.mark.skipif(not agent_available, reason="pipelines.agent / pipelines.replay not present"),
]
LIVE = "live-1"


def call_with_barge_in(path: Path) -> None:
    """Real LibriVox sentences as caller turns: the second starts 1.8 s after the first ends,
    while the agent's reply is still playing (a barge-in: past ``turn.takeback_ms`` after the
    reply began, so not a continuation of the first turn); the third after a 2.5 s pause."""
    from voice.audio import read_wav, resample, write_wav

    clips = {c.path.stem[-4:]: c for c in librivox()}
    parts = []
    for stem, pause_s in (("0880", 1.8), ("0890", 2.5), ("0880", 2.5)):
        pcm, rate = read_wav(clips[stem].path)
        parts += [resample(pcm, rate, 16000), np.zeros(int(pause_s * 16000), np.int16)]
    write_wav(path, np.concatenate(parts), 16000)


async def scenario(tmp: Path) -> dict[str, Any]:
    from pipelines.agent import Agent
    from pipelines.replay import replay_file
    from voice.transports.replay import TimelineOutput

    wav = tmp / "call.wav"
    call_with_barge_in(wav)
    out: dict[str, Any] = {}
    with running_mosquitto() as broker:
        cfg = AgentConfig()
        cfg.mqtt.host, cfg.mqtt.port = "127.0.0.1", broker.port
        agent = await Agent.load(cfg)
        emitted: list[tuple[str, str]] = []  # what the bus carried, to compare with what arrived
        agent.bus.add_listener(lambda ev: emitted.append((ev.session_id, ev.kind)))
        out["emitted"] = emitted
        async with Collector(broker.port, "voiceagent/#") as col:
            bridge = await start_mqtt(agent, cfg.mqtt)
            assert bridge is not None and await bridge.wait_connected(5)
            metrics = start_metrics_server(agent, 0, drop_sources={"mqtt": lambda: bridge.dropped})
            try:
                report = await replay_file(agent, wav, tmp / "out.wav", fast=True)
                await bridge.wait_idle(10)
                text = await asyncio.to_thread(lambda: urllib.request.urlopen(metrics.url, timeout=5).read().decode())
            finally:
                metrics.close()
            out["report"], out["metrics_text"] = report, text

            # A live call that only MQTT talks to.
            clock = AudioClock()
            output = TimelineOutput(16000, clock, cfg.output.buffer_ms, capacity_s=30)
            session = agent.new_session(output, clock, "replay", session_id=LIVE)
            await session.start()
            clock.t = 1.0
            out["control"] = await drive_by_mqtt(broker.port, col, session, output)
            out["live_report"] = await session.close()
            await bridge.wait_idle(10)
            out["stats"] = await bridge.close()
            out["messages"] = list(col.messages)
    (tmp / "REPORT.json").write_text(json.dumps(out["report"]))
    return out


async def drive_by_mqtt(port: int, col: Collector, session: Any, output: Any) -> dict[str, Any]:
    import aiomqtt

    base = f"voiceagent/agent/{LIVE}"
    seen: dict[str, Any] = {}

    async def send(command: str, payload: str) -> dict:
        n = len(col.json(f"{LIVE}/reply"))
        await ctl.publish(f"{base}/control/{command}", payload, qos=1)
        await col.wait_for(lambda c: len(c.json(f"{LIVE}/reply")) > n, within_s=30)
        return col.json(f"{LIVE}/reply")[n]

    async with aiomqtt.Client("127.0.0.1", port) as ctl:
        seen["say"] = await send("say", '{"text": "Your table is booked for eight.", "id": "r1"}')
        seen["said"] = list(session.said)
        seen["audio_samples"] = int(np.count_nonzero(output.track))
        seen["budgets_ok"] = await send("config/budgets", '{"llm_block_ms": 60, "target_gap_ms": 260}')
        seen["llm_block_ms"] = session.budgets.llm_block_ms
        seen["budgets_bad"] = await send("config/budgets", '{"llm_block_ms": 4000}')
        seen["llm_block_ms_after_bad"] = session.budgets.llm_block_ms
        seen["mute"] = await send("mute", "")
        seen["muted"] = session.muted
        seen["unmute"] = await send("unmute", "")
        seen["unmuted"] = not session.muted
        seen["hangup"] = await send("hangup", "")
        seen["hung_up"] = session.hangup_requested.is_set()
    return seen


@pytest.fixture(scope="module")
def call(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("e2e")
    result = asyncio.run(scenario(tmp))
    result["tmp"] = tmp
    return result


def events(call: dict[str, Any], sid: str) -> list[tuple[str, dict]]:
    """What the bridge published for session ``sid`` (not the control messages sent to it)."""
    return [
        (t.split("/", 3)[3], json.loads(p))
        for t, p, _ in call["messages"]
        if t.split("/")[2:3] == [sid] and "/control/" not in t
    ]


def test_turn_events_of_a_replayed_call_arrive(call: dict[str, Any]) -> None:
    report = call["report"]
    sid = report["call"]["session_id"]
    evs = events(call, sid)
    kinds = [k for k, _ in evs]
    assert kinds[0] == "session/start" and kinds[-1] == "session/end"
    assert all(d["version"] == 1 and d["session_id"] == sid for _, d in evs)
    answered = [t for t in report["turns"] if t.get("agent_audio_start_s") is not None]
    assert answered, "the agent answered no turn of the replayed call"
    assert any(t.get("interrupted") for t in answered), "the second utterance did not barge in"
    # exactly one turn event per turn, sent when the turn is final: heard to the end or interrupted
    turn_events = [d["report"] for k, d in evs if k == "turn"]
    assert [t["transcript"] for t in turn_events] == [t["transcript"] for t in answered]
    assert kinds.count("interrupt") == sum(1 for t in answered if t.get("interrupted"))
    for published, final in zip(turn_events, answered, strict=True):
        assert published["gap_ms"] == final["gap_ms"] and published["stages"] == final["stages"]
        assert published["speculation"]["hit"] == final["speculation"]["hit"]
        assert published["interrupted"] == final["interrupted"]
        assert published["heard_response"] == final["heard_response"]
    assert kinds.count("violation") == report["summary"]["violations"]
    assert kinds.count("endpoint") >= len(report["turns"])
    # Every event the bus carried arrived, except partials over the rate limit.
    on_bus = [k for s, k in call["emitted"] if s == sid]
    assert [k for k in kinds if k != "partial"] == [k for k in on_bus if k != "partial"]
    stats = call["stats"]
    assert 1 <= kinds.count("partial") <= on_bus.count("partial")
    assert stats["partials_suppressed"] == on_bus.count("partial") - kinds.count("partial")
    assert stats["dropped"] == 0 and stats["queued"] == 0
    ours = [t for t, _, _ in call["messages"] if not t.endswith("/status") and "/control/" not in t]
    assert stats["delivered"] == len(ours)


def test_metrics_match_the_call_report(call: dict[str, Any]) -> None:
    report = call["report"]
    m = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(call["metrics_text"])
        for s in fam.samples
    }
    rp = (("transport", "replay"),)
    answered = [t for t in report["turns"] if t.get("gap_ms") is not None]
    assert m[("voice_agent_turns_total", rp)] == len(answered)
    assert m[("voice_agent_e2e_latency_seconds_count", rp)] == len(answered)
    assert m[("voice_agent_e2e_latency_seconds_sum", rp)] == pytest.approx(sum(t["gap_ms"] for t in answered) / 1000)
    for stage, name in [
        ("vad_endpoint", "end_of_turn_delay"),
        ("asr_final", "transcription_delay"),
        ("llm_block", "llm_ttft"),
        ("tts_first_audio", "tts_ttfb"),
    ]:
        want = sum(t["stages"][stage] for t in answered) / 1000
        assert m[(f"voice_agent_{name}_seconds_sum", rp)] == pytest.approx(want, abs=1e-6), name
    # a reply from the reply cache (the third turn repeats the first) took no denoising passes
    assert m[("voice_agent_llm_steps_sum", rp)] == sum(t["stages"].get("llm_steps", 0) for t in answered)
    violations = sum(v for (name, _), v in m.items() if name == "voice_agent_budget_violations_total")
    assert violations == report["summary"]["violations"]
    hits = sum(1 for t in answered if t["speculation"]["used"] and t["speculation"]["hit"])
    assert m.get(("voice_agent_speculations_total", (("result", "hit"), *rp)), 0) == hits
    assert m[("voice_agent_events_dropped_total", (("sink", "mqtt"),))] == 0
    assert m[("voice_agent_sessions_total", rp)] == 1 and m[("voice_agent_sessions_active", ())] == 0


def test_control_messages_act_on_a_live_session(call: dict[str, Any]) -> None:
    c = call["control"]
    assert c["say"]["ok"] and c["say"]["id"] == "r1"
    assert c["said"] and c["said"][-1]["text"] == "Your table is booked for eight."
    assert c["audio_samples"] > 16000 * 0.5  # Piper spoke it into the call's output
    assert c["budgets_ok"]["ok"] and c["llm_block_ms"] == 60
    assert not c["budgets_bad"]["ok"] and "target_gap_ms" in c["budgets_bad"]["error"]
    assert c["llm_block_ms_after_bad"] == 60
    assert c["mute"]["ok"] and c["muted"] and c["unmute"]["ok"] and c["unmuted"]
    assert c["hangup"]["ok"] and c["hung_up"]
    kinds = [k for k, _ in events(call, LIVE)]
    assert kinds[0] == "session/start" and kinds[-1] == "session/end"


def test_timeline_of_the_replayed_call(call: dict[str, Any]) -> None:
    from pipelines.report_plot import plot_timeline
    from pipelines.report_view import load_report

    png = plot_timeline(load_report(call["tmp"] / "REPORT.json"), call["tmp"] / "timeline.png")
    check_png(png, min_height=700)

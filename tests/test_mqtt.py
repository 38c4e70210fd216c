"""The MQTT bridge against a real mosquitto: topics and schema, status and last will,
partial rate limit, control messages, and broker faults with exact delivered/dropped counts.

The agent here is a FakeAgent (a real EventBus plus FakeSessions) so that each behaviour of
the bridge is isolated; tests/test_mqtt_e2e.py runs a real call through the real Agent.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from pydantic import ValidationError

from pipelines.config import BudgetConfig, ConfigError, MqttConfig
from pipelines.events import (
    SCHEMA_VERSION,
    Dtmf,
    EndpointDecision,
    EventBus,
    Interrupt,
    Partial,
    SessionEnd,
    SessionStart,
    SpeechStart,
    TurnCompleted,
    Violation,
)
from pipelines.mqtt import apply_mqtt_url, start_mqtt, topic_safe
from tests.mosquitto import Collector, Mosquitto, free_port, running_mosquitto

pytestmark = pytest.mark.peer
ROOT = Path(__file__).resolve().parents[1]
# Far below what blocking on the broker would cost (a publish timeout is seconds), far above
# what this shared 2-core machine's scheduler alone adds (up to about 0.17 s seen under load).
MAX_LAG_S = 0.3


class FakeSession:
    """Records what control did to it; validates budgets the way a session must."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.muted = False
        self.budgets = BudgetConfig()
        self.hangup_requested = asyncio.Event()
        self.transfers: list[str] = []
        self.fail_say = False

    async def say(self, text: str) -> None:
        if self.fail_say:
            raise RuntimeError("TTS is down")
        self.said.append(text)

    def request_transfer(self, to: str) -> None:
        self.transfers.append(to)

    def set_muted(self, muted: bool) -> None:
        self.muted = muted

    def update_budgets(self, values: dict) -> None:
        try:
            self.budgets = BudgetConfig.model_validate({**self.budgets.model_dump(), **values})
        except ValidationError as exc:
            raise ConfigError(f"invalid budgets: {exc.errors()[0]['msg']}") from None


class FakeAgent:
    def __init__(self) -> None:
        self.bus = EventBus()
        self.sessions: dict[str, Any] = {}


@pytest.fixture
def broker():
    with running_mosquitto() as b:
        yield b


def mqtt_cfg(port: int, **kw: Any) -> MqttConfig:
    return MqttConfig(host="127.0.0.1", port=port, **kw)


class LoopLag:
    """How late the event loop runs a 5 ms tick: what a call's audio path would feel."""

    def __init__(self) -> None:
        self.max_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.005)
            self.max_s = max(self.max_s, time.monotonic() - t - 0.005)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def seqs(col: Collector) -> list[int]:
    return [json.loads(p)["seq"] for t, p, _ in col.messages if t.endswith("/dtmf")]


def test_url_override() -> None:
    cfg = apply_mqtt_url(MqttConfig(prefix="x"), "mqtts://bob:s%40cret@broker.example:9999")
    assert (cfg.host, cfg.port, cfg.tls, cfg.username, cfg.password, cfg.prefix) == (
        "broker.example",
        9999,
        True,
        "bob",
        "s@cret",
        "x",
    )
    assert apply_mqtt_url(MqttConfig(), "mqtt://127.0.0.1").port == 1883
    for bad in ("http://host:1", "mqtt://", "mqtt://host:notaport"):
        with pytest.raises(ConfigError, match="--mqtt"):
            apply_mqtt_url(MqttConfig(), bad)
    assert topic_safe("a/b+c#d") == "a_b_c_d"


async def test_no_broker_configured_publishes_nothing() -> None:
    assert await start_mqtt(FakeAgent(), MqttConfig()) is None


async def test_bad_tls_ca_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="tls_ca"):
        await start_mqtt(FakeAgent(), MqttConfig(host="127.0.0.1", tls=True, tls_ca="/nonexistent/ca.pem"))


async def test_events_topics_schema_and_status(broker: Mosquitto) -> None:
    agent = FakeAgent()
    async with Collector(broker.port, "voiceagent/#") as col:
        bridge = await start_mqtt(agent, mqtt_cfg(broker.port))
        assert bridge is not None
        assert await bridge.wait_connected(5)
        report = {
            "index": 0,
            "transcript": "hello",
            "response": "hi there",
            "gap_ms": 180.0,
            "stages": {"llm_steps": 4},
        }
        events = [
            SessionStart("s1", 0.0, transport="replay"),
            SpeechStart("s1", 0.5),
            Partial("s1", 0.9, text="hel", stable=""),
            EndpointDecision("s1", 1.3, silence_ms=80, reason="complete"),
            Violation("s1", 1.4, stage="llm_block", budget_ms=40, actual_ms=55, over_ms=15, turn=0),
            TurnCompleted("s1", 1.5, report=report),
            Interrupt("s1", 2.0, turn=0, heard_text="hi"),
            Dtmf("s1", 2.5, digit="5", duration_ms=100),
            SessionEnd("s1", 3.0, reason="completed", turns=1),
        ]
        sent_at = time.monotonic()
        for ev in events:
            agent.bus.emit(ev)
        await col.wait_for(lambda c: any(t.endswith("/session/end") for t, _, _ in c.messages))
        latency_ms = (time.monotonic() - sent_at) * 1000
        got = [(t, json.loads(p)) for t, p, _ in col.messages if "/s1/" in t]
        assert [t for t, _ in got] == [f"voiceagent/agent/s1/{ev.kind}" for ev in events]
        for (_, d), ev in zip(got, events, strict=True):
            assert d["version"] == SCHEMA_VERSION
            assert d["type"] == ev.kind and d["session_id"] == "s1" and d["agent_id"] == "agent"
        assert [d["seq"] for _, d in got] == sorted(d["seq"] for _, d in got)
        assert got[5][1]["report"] == report
        assert got[4][1]["over_ms"] == 15
        # With set_tcp_nodelay the whole call's events arrive in well under one 40 ms Nagle delay each.
        assert latency_ms < 9 * 40, latency_ms
        status = [json.loads(p) for t, p, _ in col.messages if t == bridge.status_topic]
        assert status and status[0]["state"] == "online" and status[0]["version"] == SCHEMA_VERSION

        stats = await bridge.close()
    assert stats["delivered"] == len(events) and stats["dropped"] == 0
    # A late subscriber gets the retained status: the agent said goodbye.
    async with Collector(broker.port, "voiceagent/agent/status") as late:
        await late.wait_for(lambda c: bool(c.messages))
        topic, payload, retained = late.messages[0]
        assert retained and json.loads(payload)["state"] == "offline"


async def test_last_will_says_offline_when_the_agent_dies(broker: Mosquitto) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio
        from pipelines.config import MqttConfig
        from pipelines.events import EventBus
        from pipelines.mqtt import start_mqtt

        class FakeAgent:
            bus = EventBus()
            sessions = {{}}

        async def main():
            bridge = await start_mqtt(FakeAgent(), MqttConfig(host="127.0.0.1", port={broker.port}, agent_id="doomed"))
            assert await bridge.wait_connected(5)
            print("connected", flush=True)
            await asyncio.sleep(60)

        asyncio.run(main())
        """
    )
    async with Collector(broker.port, "voiceagent/doomed/status") as col:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)  # type: ignore[union-attr]
            assert line.strip() == b"connected", (line, await proc.stderr.read())  # type: ignore[union-attr]
            await col.wait_for(lambda c: len(c.messages) >= 1)
            assert json.loads(col.messages[0][1])["state"] == "online"
        finally:
            proc.kill()
            await proc.wait()
        await col.wait_for(lambda c: len(c.messages) >= 2)
        assert json.loads(col.messages[1][1])["state"] == "offline"


async def test_partials_are_rate_limited_and_the_latest_still_goes_out(broker: Mosquitto) -> None:
    agent = FakeAgent()
    async with Collector(broker.port, "voiceagent/#") as col:
        bridge = await start_mqtt(agent, mqtt_cfg(broker.port, partial_rate_hz=5.0))
        assert bridge is not None and await bridge.wait_connected(5)
        texts = [f"word {i}" for i in range(30)]
        t0 = time.monotonic()
        for i, text in enumerate(texts):  # 100 partials per second for 0.3 s
            agent.bus.emit(Partial("s1", i * 0.01, text=text))
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - t0
        await asyncio.sleep(0.25)  # one more window for the trailing partial
        got = [d["text"] for d in col.json("/partial")]
        assert 2 <= len(got) <= int(elapsed * 5) + 2, got
        assert got[0] == texts[0] and got[-1] == texts[-1]
        assert bridge.partials_suppressed == len(texts) - len(got)

        # A partial still waiting for its window when the turn ends is stale: never after the turn.
        agent.bus.emit(Partial("s2", 0.0, text="first"))
        agent.bus.emit(Partial("s2", 0.1, text="stale"))
        agent.bus.emit(TurnCompleted("s2", 0.2, report={"index": 0}))
        await asyncio.sleep(0.4)
        s2 = [t.rsplit("/", 1)[1] for t, _, _ in col.messages if "/s2/" in t]
        assert s2 == ["partial", "turn"]
        await bridge.close()


async def test_control_messages_act_on_live_sessions(broker: Mosquitto) -> None:
    agent = FakeAgent()
    session, bystander = FakeSession(), FakeSession()
    agent.sessions.update({"call-1": session, "call-2": bystander})
    base = "voiceagent/agent"
    async with Collector(broker.port, f"{base}/+/reply") as replies, aiomqtt.Client("127.0.0.1", broker.port) as ctl:
        # Left retained by some earlier operator: it must not fire when the bridge (re)subscribes.
        await ctl.publish(f"{base}/call-2/control/hangup", b'{"reason": "old"}', qos=1, retain=True)
        bridge = await start_mqtt(agent, mqtt_cfg(broker.port))
        assert bridge is not None and await bridge.wait_connected(5)
        await replies.wait_for(lambda c: len(c.messages) == 1)
        topic, body, _ = replies.messages[0]
        assert topic == f"{base}/call-2/reply" and "retained" in json.loads(body)["error"]
        assert not bystander.hangup_requested.is_set()

        async def send(command: str, payload: str | bytes, sid: str = "call-1") -> dict:
            n = len(replies.messages)
            await ctl.publish(f"{base}/{sid}/control/{command}", payload, qos=1)
            await replies.wait_for(lambda c: len(c.messages) > n)
            topic, body, _ = replies.messages[n]
            assert topic == f"{base}/{sid}/reply"
            reply = json.loads(body)
            assert reply["version"] == SCHEMA_VERSION and reply["command"] == command
            return reply

        r = await send("say", json.dumps({"text": "Hello there.", "id": 7}))
        assert r["ok"] and r["id"] == 7 and session.said == ["Hello there."]
        assert (await send("say", "Plain text works too."))["ok"]
        assert session.said[-1] == "Plain text works too."
        assert (await send("mute", ""))["ok"] and session.muted
        assert (await send("unmute", "{}"))["ok"] and not session.muted

        assert (await send("config/budgets", '{"llm_block_ms": 50, "target_gap_ms": 250}'))["ok"]
        assert session.budgets.llm_block_ms == 50
        before = session.budgets
        for bad, why in [
            ('{"llm_block_ms": 4000}', "over target_gap_ms"),
            ('{"llm_block_ms": "fast"}', "integer"),
            ('{"no_such_budget": 1}', "Extra inputs"),
            ('{"llm_block_ms": 5', "does not parse"),
            ("[1, 2]", "JSON object"),
        ]:
            r = await send("config/budgets", bad)
            assert not r["ok"] and why in r["error"], (bad, r)
        assert session.budgets == before  # an invalid message changes nothing

        r = await send("say", "")
        assert not r["ok"] and "non-empty" in r["error"]
        r = await send("say", b"\xff\xfe")
        assert not r["ok"] and "UTF-8" in r["error"]
        r = await send("dance", "{}")
        assert not r["ok"] and "unknown command" in r["error"]
        r = await send("hangup", "", sid="no-such-call")
        assert not r["ok"] and "no live session" in r["error"]
        session.fail_say = True
        r = await send("say", "hello")
        assert not r["ok"] and "TTS is down" in r["error"]
        session.fail_say = False

        assert (await send("transfer", '{"to": "sip:desk@10.0.0.5"}'))["ok"]
        assert (await send("transfer", "tel:+15550100"))["ok"]
        r = await send("transfer", '{"to": "the front desk"}')
        assert not r["ok"] and "SIP or tel URI" in r["error"]
        assert session.transfers == ["sip:desk@10.0.0.5", "tel:+15550100"]

        assert not session.hangup_requested.is_set()
        assert (await send("hangup", '{"reason": "operator"}'))["ok"]
        assert session.hangup_requested.is_set()
        stats = await bridge.close()
    assert stats["control_ok"] == 8 and stats["control_errors"] == 12
    assert not bystander.hangup_requested.is_set()


async def test_broker_absent_at_start_then_delivered_without_loss(broker: Mosquitto) -> None:
    agent = FakeAgent()
    # The durable subscriber's session is saved before the broker goes away, so the broker,
    # once back, holds events for it however the two reconnects race.
    async with Collector(broker.port, "voiceagent/#", durable=True) as col:
        await broker.wait_persisted(col)
        await asyncio.to_thread(broker.kill)
        bridge = await start_mqtt(agent, mqtt_cfg(broker.port, reconnect_min_s=0.05, reconnect_max_s=0.3))
        assert bridge is not None
        with LoopLag() as lag:
            for i in range(30):
                agent.bus.emit(Dtmf("s1", i * 0.1, digit=str(i % 10)))
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
        assert not bridge.connected and bridge.queued == 30 and bridge.dropped == 0
        assert lag.max_s < MAX_LAG_S, f"event loop stalled {lag.max_s * 1000:.0f} ms while the broker was absent"
        await asyncio.to_thread(broker.start)
        assert await bridge.wait_connected(5)
        await col.wait_for(lambda c: len(seqs(c)) >= 30)
        assert seqs(col) == list(range(1, 31))
        stats = await bridge.close()
    assert stats["delivered"] == 30 and stats["dropped"] == 0 and stats["connects"] == 1


async def test_broker_killed_mid_call_counts_delivered_and_dropped(broker: Mosquitto) -> None:
    agent = FakeAgent()
    bound = 50
    async with Collector(broker.port, "voiceagent/#", durable=True) as col:
        await broker.wait_persisted(col)
        bridge = await start_mqtt(
            agent, mqtt_cfg(broker.port, queue_max=bound, reconnect_min_s=0.05, reconnect_max_s=0.3)
        )
        assert bridge is not None and await bridge.wait_connected(5)
        n = 0

        def emit(k: int) -> None:
            nonlocal n
            for _ in range(k):
                n += 1
                agent.bus.emit(Dtmf("s1", n * 0.05, digit=str(n % 10)))

        emit(20)
        await col.wait_for(lambda c: len(seqs(c)) == 20)
        # the subscriber can have a message before the broker's acknowledgement reaches the
        # bridge, which counts it delivered only then (16 of 20 once, in a full-suite run)
        assert await bridge.wait_idle(5)
        assert bridge.delivered == 20

        await asyncio.to_thread(broker.kill)
        for _ in range(200):
            if not bridge.connected:
                break
            await asyncio.sleep(0.005)
        assert not bridge.connected
        with LoopLag() as lag:
            emit(80)  # 30 more than the outbox holds: the 30 oldest go
            await asyncio.sleep(0.2)
        assert bridge.queued == bound and bridge.dropped == 30
        assert lag.max_s < MAX_LAG_S

        await asyncio.to_thread(broker.start)
        assert await bridge.wait_connected(5)
        assert await bridge.wait_idle(5)  # the backlog drains before the bound is tested again
        emit(20)
        await col.wait_for(lambda c: 120 in seqs(c))
        stats = await bridge.close()
    assert stats["delivered"] == 90 and stats["dropped"] == 30 and stats["connects"] == 2
    assert sorted(set(seqs(col))) == list(range(1, 21)) + list(range(51, 121))


async def test_no_event_lost_below_the_bound_through_a_broker_restart(broker: Mosquitto) -> None:
    """Events keep flowing while the broker dies and comes back: every one arrives (at least once)."""
    agent = FakeAgent()
    async with Collector(broker.port, "voiceagent/#", durable=True) as col:
        await broker.wait_persisted(col)
        bridge = await start_mqtt(agent, mqtt_cfg(broker.port, reconnect_min_s=0.05, reconnect_max_s=0.3))
        assert bridge is not None and await bridge.wait_connected(5)
        total = 300
        with LoopLag() as lag:
            for i in range(1, total + 1):
                agent.bus.emit(Dtmf("s1", i * 0.002, digit="1"))
                if i == 100:
                    asyncio.get_running_loop().run_in_executor(None, broker.kill)
                if i == 200:
                    await asyncio.to_thread(broker.start)
                await asyncio.sleep(0.002)
        await col.wait_for(lambda c: set(seqs(c)) >= set(range(1, total + 1)), within_s=10)
        stats = await bridge.close()
    assert stats["dropped"] == 0 and stats["delivered"] == total and stats["connects"] == 2
    assert lag.max_s < MAX_LAG_S, lag.max_s
    # At least once on both hops: what was in flight at the kill (bridge to broker, and broker
    # to this subscriber from its saved session) may arrive twice; nothing may be missing.
    assert len(seqs(col)) >= total


async def test_nothing_reaches_a_stopped_bridge_and_close_is_idempotent(broker: Mosquitto) -> None:
    agent = FakeAgent()
    bridge = await start_mqtt(agent, mqtt_cfg(free_port()))  # nobody listens there
    assert bridge is not None
    agent.bus.emit(Dtmf("s1", 0.0, digit="1"))
    t = time.monotonic()
    stats = await bridge.close(flush_timeout=0.5)
    assert time.monotonic() - t < 2.0  # a dead broker does not hold up shutdown
    assert stats["delivered"] == 0 and stats["queued"] == 1 and not stats["connected"]
    assert await bridge.close() == stats
    agent.bus.emit(Dtmf("s1", 0.1, digit="2"))  # after close the bus has no MQTT subscriber left
    assert bridge.queued == 1


async def test_tls_with_the_configured_ca_and_refusal_without_it() -> None:
    broker = Mosquitto(tls=True)
    try:
        await asyncio.to_thread(broker.start)
        assert broker.tls_port is not None
        agent = FakeAgent()
        async with Collector(broker.port, "voiceagent/#") as col:
            bridge = await start_mqtt(agent, mqtt_cfg(broker.tls_port, tls=True, tls_ca=str(broker.ca)))
            assert bridge is not None and await bridge.wait_connected(5)
            agent.bus.emit(Dtmf("s1", 0.0, digit="7"))
            await col.wait_for(lambda c: len(seqs(c)) == 1)
            await bridge.close()
            # The system store does not trust this CA: no connection, no publishing, and no harm.
            untrusting = await start_mqtt(agent, mqtt_cfg(broker.tls_port, tls=True, reconnect_max_s=0.2))
            assert untrusting is not None
            agent.bus.emit(Dtmf("s1", 1.0, digit="8"))
            assert not await untrusting.wait_connected(1.0)
            stats = await untrusting.close(flush_timeout=0.2)
            assert stats["delivered"] == 0 and stats["queued"] == 1 and len(seqs(col)) == 1
    finally:
        broker.close()

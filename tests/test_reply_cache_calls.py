"""The reply cache in real calls: real recorded speech through the real models.

- a turn said before in another call of the same agent plays from the cache: no LM call and
  no synthesis for its words (the engines are wrapped in counting spies that still run them);
- with Redis, a second agent *process* answers from what the first stored;
- Redis killed mid-call: the call goes on uncached and says so (a `cache` event), and when
  Redis is back the cache resumes by itself.

The LM's committed deadline is widened here (``budgets.llm_block_ms``): a reply cut short by
its deadline is never cached, and on a loaded 2-core machine the default 40 ms often cuts it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipelines.agent import Agent
from pipelines.config import parse_config
from pipelines.events import Event
from pipelines.replay import TAIL_S, replay_pcm
from pipelines.speculation import same_words
from pipelines.transport import AudioClock
from tests import speech
from tests.redis_server import running_redis
from voice.audio import AudioFrame, read_wav, write_wav
from voice.transports.replay import TimelineOutput

RATE = 16000
ROOT = Path(__file__).resolve().parents[1]
WIDE = {"budgets": {"target_gap_ms": 2000, "llm_block_ms": 1500}}


def _cfg(**cache: Any) -> Any:
    return parse_config({**WIDE, "cache": cache})


def _call(clips: list[speech.Clip], gap_s: float = 2.5) -> np.ndarray:
    parts = [np.zeros(RATE, np.int16)]
    for c in clips:
        parts += [read_wav(c.path, RATE)[0], np.zeros(int(gap_s * RATE), np.int16)]
    return np.concatenate(parts)


class Spy:
    """Counts what the real engines are asked to do, and lets them do it."""

    def __init__(self, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lm: list[str] = []
        self.replies: list[str] = []
        self.tts: list[str] = []
        responder, tts = agent.engines.responder, agent.engines.tts
        agenerate, synth = responder.agenerate, tts.synth

        async def counting_agenerate(text: str, *a: Any, **kw: Any) -> Any:
            self.lm.append(text)
            reply = await agenerate(text, *a, **kw)
            self.replies.append(reply.text)
            return reply

        def counting_synth(part: str) -> Any:
            self.tts.append(part)
            return synth(part)

        monkeypatch.setattr(responder, "agenerate", counting_agenerate)
        monkeypatch.setattr(tts, "synth", counting_synth)

    def reset(self) -> None:
        self.lm.clear()
        self.replies.clear()
        self.tts.clear()


@pytest.mark.slow
async def test_turn_said_before_plays_from_cache_without_lm_or_tts(engines, monkeypatch) -> None:
    agent = Agent(_cfg(), engines)
    spy = Spy(agent, monkeypatch)
    clip = speech.librivox()[1]  # "he was not an ill disposed young man"
    first, _ = await replay_pcm(agent, _call([clip]), RATE, fast=True)
    t1 = first["turns"][0]
    assert t1["cache"]["state"] == "miss" and t1["cache"]["stored"], t1["cache"]
    assert any(same_words(x, t1["transcript"]) for x in spy.lm)

    spy.reset()
    second, track = await replay_pcm(agent, _call([clip]), RATE, fast=True)
    t2 = second["turns"][0]
    assert same_words(t2["transcript"], t1["transcript"])
    assert t2["cache"]["state"] == "hit", t2["cache"]
    assert t2["response"] == t1["response"] and t2["agent_audio_start_s"] is not None
    assert "llm_steps" not in t2["stages"]
    # no LM call for these words, and no synthesis of the reply: its audio came from the cache.
    # Partials that are not the turn ("He was not an ill-spoke.") may still be speculated on,
    # and only their replies' first clauses are synthesised.
    assert not any(same_words(x, t1["transcript"]) for x in spy.lm), spy.lm
    speculative_first = {agent.engines.tts.split(r)[0] for r in spy.replies if r}
    assert set(spy.tts) <= speculative_first, (spy.tts, spy.replies)
    assert not set(agent.engines.tts.split(t1["response"])[1:]) & set(spy.tts)
    assert np.abs(track.astype(np.int32)).max() > 1000  # the cached reply was played
    assert second["summary"]["cache_hits"] == 1 and second["summary"]["cache_hit_rate"] == 1.0


@pytest.mark.slow
async def test_specifics_are_answered_fresh(engines) -> None:
    agent = Agent(_cfg(), engines)
    card = speech.cards()[0]  # "ten of clubs"
    for _ in range(2):
        report, _ = await replay_pcm(agent, _call([card]), RATE, fast=True)
        c = report["turns"][0]["cache"]
        # Whisper writes "10 of clubs." or "Ten of clubs."
        assert c["state"] == "uncacheable" and c["reason"] in ("digits", "number word") and not c["stored"], c
        assert report["turns"][0]["response"]


async def _feed(session: Any, pcm: np.ndarray, start_s: float, frame_ms: int = 20) -> float:
    """Fast replay of one stretch of a call into a running session; returns the call time it ends at."""
    n = RATE * frame_ms // 1000
    t = start_s
    for i in range(0, len(pcm) - n + 1, n):
        await session.push_audio(AudioFrame(pcm[i : i + n], RATE, t))
        await session.idle()
        t += frame_ms / 1000
    return t


@pytest.mark.slow
@pytest.mark.peer
async def test_redis_killed_mid_call_and_back(engines) -> None:
    clip = read_wav(speech.librivox()[1].path, RATE)[0]
    turn = np.concatenate([np.zeros(RATE, np.int16), clip, np.zeros(int(2.5 * RATE), np.int16)])
    with running_redis() as server:
        cfg = _cfg(backend="redis", redis={"url": server.url, "reconnect_min_s": 0.05, "reconnect_max_s": 0.4})
        agent = Agent(cfg, engines)
        events: list[Event] = []
        agent.bus.add_listener(events.append)
        clock = AudioClock()
        output = TimelineOutput(RATE, clock, cfg.output.buffer_ms, capacity_s=60.0)
        session = agent.new_session(output, clock, "replay")
        await session.start()
        t = await _feed(session, turn, 0.0)  # 1: answered fresh, stored in Redis
        server.kill()
        t = await _feed(session, turn, t)  # 2: Redis is gone mid-call
        down = [e for e in events if e.kind == "cache"]
        assert [e.available for e in down] == [False] and down[0].backend == "redis" and down[0].error
        server.start()  # same port, empty
        deadline = time.monotonic() + 5
        while not agent.reply_cache.available and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert [e.available for e in events if e.kind == "cache"] == [False, True]  # said at once, no turn needed
        t = await _feed(session, turn, t)  # 3: the cache resumes (the new Redis is empty)
        t = await _feed(session, np.concatenate([turn, np.zeros(int(TAIL_S * RATE), np.int16)]), t)  # 4
        report = await session.close()
        await agent.aclose()
    states = [x["cache"]["state"] for x in report["turns"]]
    assert states == ["miss", "unavailable", "miss", "hit"], [(x["transcript"], x["cache"]) for x in report["turns"]]
    assert all(x["response"] and x["agent_audio_start_s"] is not None for x in report["turns"])  # the call went on
    assert [x["cache"]["stored"] for x in report["turns"][:3]] == [True, False, True]
    turn_events = [e for e in events if e.kind == "turn"]
    assert [e.report["cache"]["state"] for e in turn_events] == states  # the `turn` event carries it


@pytest.mark.slow
@pytest.mark.peer
def test_two_agent_processes_share_answers_through_redis(tmp_path) -> None:
    lv = speech.librivox()
    call = _call([lv[1], lv[4]])
    write_wav(tmp_path / "call.wav", call, RATE)
    with running_redis() as server:
        cfg = {**WIDE, "cache": {"backend": "redis", "redis": {"url": server.url}}}
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
        reports = []
        for name in ("a", "b"):  # two agents, one after the other, each its own process
            proc = subprocess.run(
                [sys.executable, "-m", "pipelines.cli", "replay", str(tmp_path / "call.wav"), "--fast",
                 "--config", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / f"{name}.wav"),
                 "--report", str(tmp_path / f"{name}.json")],
                capture_output=True, text=True, timeout=400, cwd=ROOT)
            assert proc.returncode == 0, proc.stderr[-3000:]
            reports.append(json.loads((tmp_path / f"{name}.json").read_text()))
    a, b = ([t for t in r["turns"]] for r in reports)
    assert [t["cache"]["state"] for t in a] == ["miss", "miss"] and all(t["cache"]["stored"] for t in a), \
        [t["cache"] for t in a]
    assert [t["cache"]["state"] for t in b] == ["hit", "hit"], [t["cache"] for t in b]
    assert [t["response"] for t in b] == [t["response"] for t in a]
    assert all("llm_steps" not in t["stages"] for t in b)

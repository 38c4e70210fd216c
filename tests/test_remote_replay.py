"""Whole calls through the remote LM backend (``llm.backend: openai``): `voice-agent replay` with
`transformers serve` on loopback as the LM server, and a session whose LM misses its deadline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

from llm.remote import RemoteResponder
from pipelines.agent import Agent
from pipelines.config import parse_config
from pipelines.events import LlmError, Violation
from pipelines.replay import replay_pcm
from pipelines.session import Engines
from tests import speech
from tests.openai_server import transformers_server  # noqa: F401 (fixture "server")
from tests.tcp_relay import TcpRelay
from voice.audio import read_wav, write_wav

RATE = 16000



def remote_config(base_url: str, model: str, **llm_openai: object) -> dict:
    return {
        "llm": {"backend": "openai", "openai": {"base_url": base_url, "model": model, "timeout_ms": 3000,
                                                **llm_openai}},
        "turn": {"lm_end_of_turn": False},  # no local model: the remote LM gives no turn-end opinion
        # a loopback server on a shared 2-core CPU: the first clause takes tens of ms, not 40
        "budgets": {"target_gap_ms": 2000, "llm_block_ms": 1000},
    }


def call(clips: list[speech.Clip], gap_s: float = 2.0) -> tuple[np.ndarray, list[tuple[float, float]]]:
    parts, bounds, t = [np.zeros(RATE // 2, np.int16)], [], 0.5
    for c in clips:
        pcm, _ = read_wav(c.path, RATE)
        parts += [pcm, np.zeros(int(gap_s * RATE), np.int16)]
        bounds.append((t, t + len(pcm) / RATE))
        t += len(pcm) / RATE + gap_s
    return np.concatenate(parts), bounds


def test_cli_replay_through_the_remote_backend_gives_spoken_replies(server, tmp_path: Path) -> None:
    clips = speech.librivox()
    pcm, bounds = call([clips[1], clips[4]])
    wav, out, report_path, cfg_path = (tmp_path / n for n in ("in.wav", "out.wav", "report.json", "cfg.yaml"))
    write_wav(wav, pcm, RATE)
    cfg_path.write_text(yaml.safe_dump(remote_config(server.base_url, server.model)))
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "replay", str(wav), "--out", str(out), "--report", str(report_path),
         "--config", str(cfg_path), "--fast"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    turns = report["turns"]
    assert len(turns) == len(bounds), [t["transcript"] for t in turns]
    assert report["summary"]["llm_errors"] == 0 and report["summary"]["fallbacks"] == 0
    assert report["call"]["config"]["llm"]["backend"] == "openai"
    track, rate = sf.read(out, dtype="int16")
    assert rate == RATE
    for turn in turns:
        assert turn["response"] and turn["llm_error"] is None and turn["llm_requests"] >= 1
        assert turn["stages"]["llm_tokens_per_s"] > 0
        # the reply is speech in the agent's channel, where the report says it is
        a, b = turn["agent_audio_start_s"], turn["agent_audio_end_s"]
        seg = track[int(a * RATE) : int(b * RATE), 1].astype(np.float64)
        assert len(seg) > RATE * 0.2 and np.sqrt(np.mean(seg**2)) > 300


async def test_a_late_lm_gives_an_error_event_a_violation_and_the_fallback(server, engines) -> None:
    """The LM server stops sending (a stalled GPU box) and the committed turn's 150 ms deadline
    passes: the caller hears the fallback, and the events say why."""
    relay = await TcpRelay(server.port).start()
    relay.stall_after = 0  # connects and takes the request, then says nothing
    try:
        raw = remote_config(relay.base_url, server.model)
        raw["budgets"] = {"target_gap_ms": 400, "llm_block_ms": 150}
        raw["turn"]["fallback_text"] = "One moment."
        cfg = parse_config(raw)
        remote = RemoteResponder(cfg.llm)
        agent = Agent(cfg, Engines(asr=engines.asr, responder=remote, tts=engines.tts))
        events: list = []
        agent.bus.add_listener(events.append)
        pcm, _ = call([speech.librivox()[1]], gap_s=0.5)
        report, track = await replay_pcm(agent, pcm, RATE, fast=False)
        # every request was abandoned by the client: none was left hanging on the server
        assert relay.connections and all(c.client_closed_first for c in relay.connections)
    finally:
        await relay.close()
    (turn,) = report["turns"]
    assert turn["response"] == "One moment." and turn["first_audio"] == "fallback"
    assert turn["llm_error"] == "deadline"
    errors = [e for e in events if isinstance(e, LlmError)]
    committed = [e for e in errors if not e.speculative]
    assert len(committed) == 1 and committed[0].error == "deadline" and "150 ms" in committed[0].message
    violations = [e for e in events if isinstance(e, Violation)]
    assert any(v.stage == "llm_block" and v.budget_ms == 150 for v in violations)
    a = turn["agent_audio_start_s"]
    seg = track[int(a * RATE) : int((a + 0.5) * RATE)].astype(np.float64)
    assert np.sqrt(np.mean(seg**2)) > 300  # the fallback was spoken
    assert remote.cancelled >= 1  # the late requests were closed, not left running

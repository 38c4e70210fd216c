"""`voice-agent replay --concurrent`: simultaneous calls on one agent, from real recorded speech."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipelines.replay_concurrent import load_inputs, replay_concurrent
from tests import speech
from tests.test_replay import RATE, build_call
from voice.audio import AudioInputError, read_wav, write_wav


def _calls(tmp_path: Path, callers: tuple[tuple[str, speech.Clip], ...], gap_s: float) -> tuple[list[Path], Path, Path]:
    """One single-turn call per (name, clip) as NAME.wav, and empty OUT and REPORT folders."""
    paths = []
    for name, clip in callers:
        pcm, _ = build_call([clip], gap_s=gap_s)
        write_wav(tmp_path / f"{name}.wav", pcm, RATE)
        paths.append(tmp_path / f"{name}.wav")
    out, rep = tmp_path / "out", tmp_path / "rep"
    out.mkdir()
    rep.mkdir()
    return paths, out, rep


@pytest.mark.slow
async def test_two_simultaneous_calls_both_get_replies_and_their_files(agent, tmp_path) -> None:
    lv = speech.librivox()
    paths, out, rep = _calls(tmp_path, (("alice", lv[1]), ("bob", lv[4])), gap_s=2.0)
    summary = await replay_concurrent(agent, load_inputs(paths), out, rep)
    assert summary["calls"] == 2 and not summary["failed"] and summary["mode"] == "realtime"
    assert [c["call"] for c in summary["per_call"]] == ["alice", "bob"]
    for call in summary["per_call"]:
        assert call["turns"] >= 1 and call["answered"] >= 1, call
        assert call["gap_p50_ms"] is not None and call["gap_p95_ms"] >= call["gap_p50_ms"]
    assert summary["overall"]["answered"] == sum(c["answered"] for c in summary["per_call"])
    assert summary["cpu"] > 0 and summary["rss_mb"] > 0
    assert json.loads((rep / "summary.json").read_text()) == summary
    for name, path in zip(("alice", "bob"), paths, strict=True):
        report = json.loads((rep / f"{name}.json").read_text())
        assert report["call"]["concurrent_calls"] == 2 and report["call"]["input"] == str(path)
        data, rate = sf.read(out / f"{name}.out.wav", dtype="int16")
        caller, _ = read_wav(path)
        assert rate == RATE and data.shape[1] == 2
        assert np.array_equal(data[: len(caller), 0], caller)  # channel 0 is the caller, aligned
        turn = report["turns"][0]  # channel 1 holds the reply where the report puts it
        seg = data[int(turn["agent_audio_start_s"] * RATE) : int(turn["agent_audio_end_s"] * RATE), 1]
        assert np.sqrt(np.mean(seg.astype(np.float64) ** 2)) > 300
    assert not agent.sessions and agent.admission.live == 0  # every seat given back


def test_inputs_are_all_read_before_any_call_and_bad_ones_are_named(tmp_path) -> None:
    good = tmp_path / "a.wav"
    write_wav(good, np.zeros(1600, np.int16), RATE)
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF junk")
    with pytest.raises(AudioInputError, match="corrupt.wav"):
        load_inputs([good, tmp_path / "corrupt.wav"])
    (tmp_path / "sub").mkdir()
    write_wav(tmp_path / "sub" / "a.wav", np.zeros(1600, np.int16), RATE)
    with pytest.raises(AudioInputError, match="both write a.out.wav"):
        load_inputs([good, tmp_path / "sub" / "a.wav"])


def test_cli_concurrent_fails_on_a_missing_input_before_any_call(tmp_path) -> None:
    good = tmp_path / "a.wav"
    write_wav(good, np.zeros(1600, np.int16), RATE)
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "replay", "--concurrent", str(good), str(tmp_path / "gone.wav"),
         "--out", str(tmp_path / "o"), "--report", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"voice-agent: error: {tmp_path / 'gone.wav'}: no such file"]
    assert not list((tmp_path / "r").glob("*.json"))


async def test_calls_beyond_capacity_are_refused_and_reported_not_half_served(agent, tmp_path) -> None:
    lv = speech.librivox()
    paths, out, rep = _calls(tmp_path, (("a", lv[1]), ("b", lv[4]), ("c", lv[2])), gap_s=1.5)
    max_calls = agent.admission.cfg.max_calls
    agent.admission.cfg.max_calls = 2
    try:
        summary = await replay_concurrent(agent, load_inputs(paths), out, rep, fast=True)
    finally:
        agent.admission.cfg.max_calls = max_calls
    assert summary["calls"] == 3 and summary["admitted"] == 2 and not summary["failed"]
    assert [c["call"] for c in summary["per_call"]] == ["a", "b"]  # admitted in the order given
    assert all(c["answered"] >= 1 for c in summary["per_call"])
    (refused,) = summary["refused"]
    assert refused["call"] == "c" and refused["refused"] == "busy" and refused["retry_after_s"] >= 1
    assert "2 calls in progress" in refused["detail"]
    assert json.loads((rep / "c.json").read_text()) == refused
    assert not (out / "c.out.wav").exists()  # nothing was served to it
    assert json.loads((rep / "a.json").read_text())["call"]["concurrent_calls"] == 2
    assert agent.admission.live == 0 and agent.admission.refused["busy"] >= 1


def test_cli_max_calls_is_checked_before_any_model_loads(tmp_path) -> None:
    good = tmp_path / "a.wav"
    write_wav(good, np.zeros(1600, np.int16), RATE)
    base = [sys.executable, "-m", "pipelines.cli", "replay", str(good), "--out", str(tmp_path / "o"),
            "--report", str(tmp_path / "r")]
    proc = subprocess.run([*base, "--concurrent", "--max-calls", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--max-calls: expected a whole number of calls, at least 1: '0'" in proc.stderr
    proc = subprocess.run([*base, "--max-calls", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "voice-agent: error: --max-calls applies to --concurrent replays only")

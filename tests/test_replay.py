"""End-to-end replay of calls built from real recorded speech, through the real models."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from pipelines.replay import replay_pcm, write_two_channel
from tests import speech
from tests.wer import wer, words
from voice.audio import read_wav

RATE = 16000


def build_call(clips: list[speech.Clip], gap_s: float = 3.0, rate: int = RATE) -> tuple[np.ndarray, list[tuple]]:
    parts = [np.zeros(int(1.0 * rate), np.int16)]
    bounds, t = [], 1.0
    for c in clips:
        pcm, _ = read_wav(c.path, rate)
        parts += [pcm, np.zeros(int(gap_s * rate), np.int16)]
        bounds.append((t, t + len(pcm) / rate, c.text))
        t += len(pcm) / rate + gap_s
    return np.concatenate(parts), bounds


def _clips() -> list[speech.Clip]:
    lv = speech.librivox()
    return [lv[1], lv[4], lv[2]]


@pytest.mark.slow
async def test_multi_turn_call_fast_mode(agent, tmp_path) -> None:
    clips = _clips()
    pcm, bounds = build_call(clips)
    report, track = await replay_pcm(agent, pcm, RATE, fast=True)
    turns = report["turns"]
    # one reply per caller turn, and the turns match the utterances
    assert len(turns) == len(bounds), [t["transcript"] for t in turns]
    for turn, (lo, hi, ref) in zip(turns, bounds, strict=True):
        assert abs(turn["user_speech_start_s"] - lo) < 0.4
        assert abs(turn["user_speech_end_s"] - hi) < 0.5
        # (0.4: a turn taken back after a premature endpoint may carry a split word, "self. fish")
        assert wer(ref, turn["transcript"]) <= 0.4, turn["transcript"]
        assert turn["response"] and turn["agent_audio_start_s"] is not None
        assert turn["gap_ms"] == pytest.approx((turn["agent_audible_s"] - turn["speech_end_s"]) * 1000, abs=1)
        assert turn["vad_gap_ms"] == pytest.approx((turn["agent_audio_start_s"] - turn["user_speech_end_s"]) * 1000,
                                                   abs=1)
        assert set(turn["stages"]) >= {"vad_endpoint", "asr_final", "llm_block", "tts_first_audio", "output"}
        # a reply from the cache had no denoising passes (a turn taken back after a premature
        # endpoint may have stored the reply its final words then hit)
        assert ("llm_steps" in turn["stages"]) == (turn["cache"]["state"] != "hit"), turn["cache"]
    assert report["summary"]["answered"] == len(bounds)
    # the agent never starts speaking while the caller speaks; where the caller starts over a
    # reply still playing (a barge-in), the reply stops within barge_in_min_ms (+ 150 ms) of
    # the caller's first word (the clip's room tone before it is no speech to stop for)
    voiced = np.nonzero(np.abs(track.astype(np.int32)) > 64)[0] / RATE
    stop_s = agent.cfg.turn.barge_in_min_ms / 1000 + 0.15
    for clip, (lo, hi, _) in zip(clips, bounds, strict=True):
        inside = voiced[(voiced > lo + 0.05) & (voiced < hi - 0.05)]
        assert not len(inside) or inside.max() < lo + speech.first_word_s(clip) + stop_s, "agent spoke over the caller"
        starts = [t["agent_audio_start_s"] for t in turns if lo + 0.05 < t["agent_audio_start_s"] < hi - 0.05]
        assert not starts, "agent started speaking while the caller spoke"
    # each reply is speech that starts after its turn and ends before the next one
    for turn in turns:
        a, b = turn["agent_audio_start_s"], turn["agent_audio_end_s"]
        seg = track[int(a * RATE) : int(b * RATE)]
        assert len(seg) > RATE * 0.2 and np.sqrt(np.mean(seg.astype(np.float64) ** 2)) > 300
    out = tmp_path / "out.wav"
    write_two_channel(out, pcm, track, RATE)
    data, rate = sf.read(out, dtype="int16")
    assert rate == RATE and data.shape[1] == 2
    assert np.array_equal(data[: len(pcm), 0], pcm)  # the caller channel is the input, sample-aligned


@pytest.mark.slow
async def test_realtime_and_fast_modes_give_the_same_transcripts(agent) -> None:
    lv = speech.librivox()
    pcm, bounds = build_call([lv[1], lv[4]], gap_s=2.5)
    fast, _ = await replay_pcm(agent, pcm, RATE, fast=True)
    real, _ = await replay_pcm(agent, pcm, RATE, fast=False)
    # the same words; Whisper's punctuation may differ with a few ms more or less of trailing audio
    assert [words(t["transcript"]) for t in fast["turns"]] == [words(t["transcript"]) for t in real["turns"]]
    assert all(t["gap_ms"] is not None and t["gap_ms"] > 0 for t in real["turns"])
    # on a real clock, the output stage is the transport's buffer: resampling the first clause
    # counts as getting it ready, so a reply that queues behind nothing is no output violation
    for t in real["turns"]:
        assert t["stages"]["output"] == pytest.approx(agent.cfg.output.buffer_ms, abs=0.1), t["stages"]
        assert not [v for v in t["violations"] if v["stage"] == "output"], t["violations"]


@pytest.mark.slow
async def test_8khz_input_is_replayed_and_aligned(agent) -> None:
    pcm8, rate = read_wav(speech.hello_8k())
    pcm = np.concatenate([np.zeros(8000, np.int16), pcm8, np.zeros(8000 * 3, np.int16)])
    report, track = await replay_pcm(agent, pcm, 8000, fast=True)
    assert report["turns"] and report["turns"][0]["transcript"]
    assert len(track) >= len(pcm)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, timeout=400)


def _zero_channel_wav(path) -> None:
    fmt = struct.pack("<HHIIHH", 1, 0, 16000, 0, 0, 16)
    body = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", 0)
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body)


def test_cli_bad_inputs_get_one_line_errors(tmp_path) -> None:
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    text = tmp_path / "text.wav"
    text.write_text("hello\n" * 100)
    zero = tmp_path / "zero.wav"
    sf.write(zero, np.zeros((0, 1), np.int16), 16000)
    nochan = tmp_path / "nochan.wav"
    _zero_channel_wav(nochan)
    for bad in (tmp_path / "missing.wav", text, empty, zero, nochan):
        r = _cli("replay", str(bad), "--out", str(tmp_path / "o.wav"), "--report", str(tmp_path / "r.json"))
        assert r.returncode != 0, bad
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith("voice-agent: error:")
        assert not (tmp_path / "o.wav").exists()


def test_cli_help_lists_subcommands_and_flags() -> None:
    r = _cli("--help")
    assert r.returncode == 0 and "replay" in r.stdout
    r = _cli("replay", "--help")
    for flag in ("--out", "--report", "--config", "--fast", "--mqtt"):
        assert flag in r.stdout


@pytest.mark.slow
def test_cli_replay_writes_report_and_two_channel_wav(tmp_path) -> None:
    lv = speech.librivox()
    pcm, _ = build_call([lv[1]], gap_s=2.0)
    stereo = np.stack([pcm, pcm], axis=1)
    inp = tmp_path / "in44.wav"
    sf.write(inp, stereo, RATE)  # stereo input is mixed down
    r = _cli("replay", str(inp), "--out", str(tmp_path / "o.wav"), "--report", str(tmp_path / "r.json"), "--fast")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["summary"]["turns"] == 1 and rep["turns"][0]["transcript"]
    data, rate = sf.read(tmp_path / "o.wav", dtype="int16")
    assert data.shape[1] == 2 and rate == RATE


@pytest.mark.slow
@pytest.mark.parametrize("rate", [16000, 8000])
async def test_report_gap_is_the_gap_the_caller_hears(agent, rate: int) -> None:
    """The report's gap_ms, against a ruler the pipeline does not hold: from the caller's last
    audible sample in the clean source clip to the first audible sound of the reply in the
    output track. The estimate is within 0-70 ms of the ruler on these turns (the VAD-based
    figure, ``vad_gap_ms``, was off by up to 490 ms on them); the bound is 80 ms."""
    from tests.ground_truth import audible_onsets, first_audible_after, speech_end
    from voice.audio import resample

    clips = _clips()
    pcm16, bounds = build_call(clips)
    pcm = resample(pcm16, RATE, rate) if rate != RATE else pcm16
    true_ends = [lo + speech_end(resample(read_wav(c.path, RATE)[0], RATE, rate), rate)
                 for (lo, _, _), c in zip(bounds, clips, strict=True)]
    report, track = await replay_pcm(agent, pcm, rate, fast=True)
    onsets = audible_onsets(track, rate)
    turns = report["turns"]
    assert len(turns) == len(bounds)
    for turn, clip, (lo, _, _), end in zip(turns, clips, bounds, true_ends, strict=True):
        # no agent sound starts while the caller is speaking (from their first word: a reply's
        # next clause may still start in the room tone before it)
        spoke = lo + speech.first_word_s(clip)
        assert not [o for o in onsets if spoke < o < end - 0.02], "agent sound inside the caller's turn"
        # the reply's first audible sound in the output track (a sound just before it, say of
        # a reply taken back, must not hide its start)
        heard = first_audible_after(track, rate, turn["agent_audio_start_s"] - 0.02)
        assert heard is not None
        true_gap = (heard - end) * 1000
        assert turn["gap_ms"] == pytest.approx(true_gap, abs=80), (turn["gap_ms"], true_gap, turn["vad_gap_ms"])
        assert turn["agent_audible_s"] >= turn["agent_audio_start_s"] - 1e-3


def test_cli_a_missing_or_corrupt_model_is_one_line_naming_the_key(tmp_path) -> None:
    wav = tmp_path / "in.wav"
    sf.write(wav, np.zeros(16000, np.int16), 16000)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "model.bin").write_bytes(b"not a model")
    (tmp_path / "voice.onnx").write_bytes(b"not a model")
    (tmp_path / "voice.onnx.json").write_text("{}")
    for section, key, value, line in (
        ("llm", "model_path", tmp_path / "gone", "llm.model_path: no model directory at"),
        ("llm", "turn_end_model_path", tmp_path / "gone", "llm.turn_end_model_path: no model directory at"),
        ("asr", "model_path", tmp_path / "gone", "asr.model_path: no CTranslate2 Whisper model in"),
        ("asr", "model_path", tmp_path / "junk", "asr.model_path: Whisper model in"),
        ("tts", "model_path", tmp_path / "gone.onnx", "tts.model_path: Piper voice not found"),
        ("tts", "model_path", tmp_path / "voice.onnx", "tts.model_path: Piper voice"),
    ):
        (tmp_path / "c.yaml").write_text(f"{section}:\n  {key}: {value}\n")
        r = _cli("replay", str(wav), "--out", str(tmp_path / "o.wav"), "--report", str(tmp_path / "r.json"),
                 "--config", str(tmp_path / "c.yaml"), "--fast")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        (err,) = [x for x in r.stderr.splitlines() if x.strip()]
        assert err.startswith(f"voice-agent: error: {line}"), err
        assert not (tmp_path / "o.wav").exists()

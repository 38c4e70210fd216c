"""Audio frame, resampler, WAV input errors and config validation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from pipelines.config import ConfigError, load_config, parse_config
from voice.audio import AudioFrame, AudioInputError, StreamResampler, frames_of, read_wav, resample


def test_resample_preserves_tone_and_length() -> None:
    t = np.arange(48000) / 48000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    out = resample(tone, 48000, 16000)
    assert abs(len(out) - 16000) <= 1
    spectrum = np.abs(np.fft.rfft(out.astype(np.float32)))
    assert abs(np.argmax(spectrum) * 16000 / len(out) - 440) < 3


def test_stream_resampler_matches_one_shot_without_clicks() -> None:
    rng = np.random.default_rng(0)
    x = (np.sin(np.arange(8000 * 2) * 2 * np.pi * 300 / 8000) * 8000).astype(np.int16)
    x += rng.integers(-50, 50, len(x)).astype(np.int16)
    rs = StreamResampler(8000, 16000)
    parts = [rs.process(x[i : i + 160]) for i in range(0, len(x), 160)] + [rs.process(np.zeros(0, np.int16), last=True)]
    stream = np.concatenate(parts).astype(np.float32)
    # no frame-boundary discontinuities: the largest sample-to-sample step stays that of a 300 Hz tone
    assert np.abs(np.diff(stream[400:-400])).max() < 2 * np.pi * 300 / 16000 * 8000 * 1.5 + 200


@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_stream_resampler_holds_no_audio_back(rate: int) -> None:
    """Every 20 ms input frame gives about 20 ms out at once (soxr HQ held 100 ms back at 8 kHz),
    and ``emitted`` stamps the output: sample n of the stream is at n / 16000 s."""
    rs = StreamResampler(rate, 16000)
    n = rate // 50
    outs = [len(rs.process(np.full(n, 1000, np.int16))) for _ in range(10)]
    assert all(o >= 300 for o in outs), outs
    assert rs.emitted == sum(outs) and abs(sum(outs) - 3200) <= 16


def test_frame_validation() -> None:
    with pytest.raises(ValueError):
        AudioFrame(np.zeros(10, dtype=np.float32), 16000, 0.0)
    frames = frames_of(np.ones(1000, dtype=np.int16), 16000, 20)
    assert [len(f.pcm) for f in frames] == [320, 320, 320, 320]
    assert frames[1].timestamp == pytest.approx(0.02)


@pytest.mark.parametrize("rate", [8000, 16000, 44100, 48000])
def test_read_any_rate_stereo_mixdown(tmp_path, rate: int) -> None:
    x = np.zeros((rate, 2), dtype=np.int16)
    x[:, 0] = 1000
    x[:, 1] = 3000
    p = tmp_path / "s.wav"
    sf.write(p, x, rate)
    pcm, r = read_wav(p)
    assert r == rate and pcm.ndim == 1 and abs(int(pcm[100]) - 2000) <= 2


def test_bad_audio_inputs(tmp_path) -> None:
    with pytest.raises(AudioInputError, match="no such file"):
        read_wav(tmp_path / "missing.wav")
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(AudioInputError, match="empty"):
        read_wav(empty)
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio\n" * 20)
    with pytest.raises(AudioInputError, match="not a readable audio file"):
        read_wav(text)
    zero = tmp_path / "zero.wav"
    sf.write(zero, np.zeros((0, 1), dtype=np.int16), 16000)
    with pytest.raises(AudioInputError, match="zero samples"):
        read_wav(zero)
    slow = tmp_path / "seven_hz.wav"
    sf.write(slow, np.zeros(70, dtype=np.int16), 7)
    with pytest.raises(AudioInputError, match="sample rate 7 Hz is below 8000 Hz"):
        read_wav(slow)
    nan = tmp_path / "nan.wav"
    sf.write(nan, np.full(1600, np.nan, dtype=np.float32), 16000, subtype="FLOAT")
    with pytest.raises(AudioInputError, match="NaN or infinite"):
        read_wav(nan)


def test_config_rejects_unknown_and_invalid_keys(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"vad\.agressiveness: unknown key"):
        parse_config({"vad": {"agressiveness": 2}})
    with pytest.raises(ConfigError, match=r"llm\.steps"):
        parse_config({"llm": {"steps": 0}})
    with pytest.raises(ConfigError, match=r"llm.*min_tokens must not exceed max_tokens"):
        parse_config({"llm": {"min_tokens": 40, "max_tokens": 32}})
    for key, value in (("temperature", -0.1), ("top_p", 0.0), ("seed", -1)):
        with pytest.raises(ConfigError, match=rf"llm\.{key}"):
            parse_config({"llm": {key: value}})
    assert parse_config({"llm": {"seed": None}}).llm.seed is None
    for value in (0, 1.5):
        with pytest.raises(ConfigError, match=r"vad\.noise_margin_share"):
            parse_config({"vad": {"noise_margin_share": value}})
    assert parse_config({"vad": {"noise_margin_share": 0.2}}).vad.noise_margin_share == 0.2
    with pytest.raises(ConfigError, match="budgets"):
        parse_config({"budgets": {"llm_block_ms": 5000}})
    bad = tmp_path / "c.yaml"
    bad.write_text("vad: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_shipped_config_is_valid() -> None:
    cfg = load_config("config.yaml")
    b = cfg.budgets
    assert b.endpoint_ms + b.asr_final_ms + b.llm_block_ms + b.tts_first_audio_ms + b.output_ms <= b.target_gap_ms


async def test_replay_pcm_refuses_a_rate_under_8_khz_and_frees_its_seat() -> None:
    from pipelines.agent import Agent
    from pipelines.config import AgentConfig
    from pipelines.replay import replay_pcm

    # a fake: engines with no models, as the rate is checked before anything is set up for the call
    no_engines = SimpleNamespace(asr=None, responder=None, tts=None, turn_audio=None)
    agent = Agent(parse_config({"cache": {"enabled": False}}), engines=no_engines)  # type: ignore[arg-type]
    assert isinstance(agent.cfg, AgentConfig)
    seat = agent.admission.admit("replay")
    assert agent.admission.live == 1
    with pytest.raises(AudioInputError, match="sample rate 4000 Hz is below 8000 Hz"):
        await replay_pcm(agent, np.zeros(4000, np.int16), 4000, fast=True, seat=seat)
    assert agent.admission.live == 0

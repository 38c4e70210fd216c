"""Barge-ins with no words in them: a burst of noise over the agent's reply cuts it, and the
reply goes on from the sentence it was cut in (`turn.resume_false_interruption`); real speech
over it takes the turn as before. Calls of real recorded speech, through the real models."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.agent import Agent
from pipelines.config import AgentConfig, TurnConfig
from pipelines.events import Event
from pipelines.replay import replay_pcm
from tests import speech
from tests.ground_truth import audible_onsets
from tests.replay_events import replay_with_events
from tests.test_replay import RATE, build_call
from voice.audio import read_wav
from voice.tts import unheard_sentences

BURST_S = 0.6


def test_unheard_sentences_start_at_the_sentence_the_caller_was_cut_off_in() -> None:
    text = "Sure. I can book that for you, what time? Goodbye!"
    assert unheard_sentences(text, 0) == text
    assert unheard_sentences(text, 1) == "I can book that for you, what time? Goodbye!"  # "Sure." heard whole
    assert unheard_sentences(text, 4) == "I can book that for you, what time? Goodbye!"
    assert unheard_sentences(text, 8) == "I can book that for you, what time? Goodbye!"
    assert unheard_sentences(text, 9) == "Goodbye!"
    assert unheard_sentences(text, 10) == ""
    assert unheard_sentences("  ", 0) == ""


def _pink_noise(n: int, rms: float) -> np.ndarray:
    """Pink noise (1/f power) at ``rms``: a burst on the line, loud as speech (seeded)."""
    spec = np.fft.rfft(np.random.default_rng(7).normal(0.0, 1.0, n))
    spec[1:] /= np.sqrt(np.arange(1, len(spec)))
    spec[0] = 0.0
    noise = np.fft.irfft(spec, n)
    return noise * (rms / noise.std())


def _over_reply(pcm: np.ndarray, at_s: float, sound: np.ndarray) -> np.ndarray:
    out = pcm.astype(np.float64)
    i = int(at_s * RATE)
    out[i : i + len(sound)] += sound
    return np.clip(out, -32768, 32767).astype(np.int16)


async def _call_and_reply(agent: Agent) -> tuple[np.ndarray, float]:
    """One caller turn of real speech, and when its reply (long enough to be cut) starts."""
    pcm, _ = build_call([speech.librivox()[1]], gap_s=5.0)
    report, _ = await replay_pcm(agent, pcm, RATE, fast=True)
    turn = report["turns"][0]
    start, end = turn["agent_audio_start_s"], turn["agent_audio_end_s"]
    assert end - start > 1.5, f"the reply is too short to barge into: {turn['response']!r}"
    return pcm, start


async def _replay(agent: Agent, pcm: np.ndarray) -> tuple[dict, np.ndarray, list[Event]]:
    return await replay_with_events(agent, pcm, RATE)


@pytest.mark.slow
async def test_a_noise_burst_over_the_reply_cuts_it_and_the_reply_goes_on(engines) -> None:
    agent = Agent(AgentConfig(), engines)
    pcm, start = await _call_and_reply(agent)
    # past turn.takeback_ms: a barge-in, not the caller going on with their own turn
    at = start + 0.8
    noisy = _over_reply(pcm, at, _pink_noise(int(BURST_S * RATE), 3000.0))
    report, track, events = await _replay(agent, noisy)
    assert len(report["turns"]) == 1, [t["transcript"] for t in report["turns"]]
    turn = report["turns"][0]
    assert turn["interrupted"] and turn["resumed_s"] is not None
    assert at + BURST_S <= turn["resumed_s"] < at + BURST_S + 1.5
    assert turn["heard_response"] == turn["response"]
    assert report["summary"]["resumed"] == 1
    # the caller hears the reply stop under the noise and start again after it
    onsets = audible_onsets(track, RATE)
    assert any(at + BURST_S <= t < turn["resumed_s"] + 0.3 for t in onsets), onsets
    assert not any(at + 0.45 <= t < at + BURST_S for t in onsets), onsets
    kinds = [e.kind for e in events if e.kind in ("interrupt", "resume", "turn")]
    assert kinds == ["interrupt", "resume", "turn"], kinds  # the turn's one event: when it is final
    assert [e.heard_text for e in events if e.kind == "interrupt"][0] != turn["response"]


@pytest.mark.slow
async def test_with_resume_off_a_noise_burst_stops_the_reply_for_good(engines) -> None:
    agent = Agent(AgentConfig(turn=TurnConfig(resume_false_interruption=False)), engines)
    pcm, start = await _call_and_reply(agent)
    at = start + 0.8
    report, track, events = await _replay(agent, _over_reply(pcm, at, _pink_noise(int(BURST_S * RATE), 3000.0)))
    turn = report["turns"][0]
    assert turn["interrupted"] and turn["resumed_s"] is None and turn["heard_response"] != turn["response"]
    assert [e.kind for e in events if e.kind in ("interrupt", "resume", "turn")] == ["interrupt", "turn"]
    cut = next(e.t for e in events if e.kind == "interrupt")
    # nothing more of the agent after the cut (the output buffer's last 20 ms aside)
    assert at < cut < at + BURST_S
    voiced = np.nonzero(np.abs(track.astype(np.int32)) > 64)[0] / RATE
    assert not len(voiced[voiced > cut + 0.05]), voiced[voiced > cut + 0.05][:3]


@pytest.mark.slow
async def test_words_over_the_reply_take_the_turn_and_the_reply_stays_cut(engines) -> None:
    agent = Agent(AgentConfig(), engines)
    pcm, start = await _call_and_reply(agent)
    words, _ = read_wav(speech.librivox()[4].path, RATE)
    report, _, events = await _replay(agent, _over_reply(pcm, start + 0.8, words.astype(np.float64)))
    first, second = report["turns"]
    assert first["interrupted"] and first["resumed_s"] is None and first["heard_response"] != first["response"]
    assert second["transcript"] and second["agent_audio_start_s"] is not None
    assert report["summary"]["resumed"] == 0
    assert "resume" not in [e.kind for e in events]

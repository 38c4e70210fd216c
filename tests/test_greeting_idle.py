"""The agent's own words outside the caller's turns: a greeting as the call starts (the caller
can talk over it), and prompts to a silent caller, then a goodbye and the hangup. Calls of real
recorded speech, through the real models."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.agent import Agent
from pipelines.config import AgentConfig, ConfigError, TurnConfig, load_config
from pipelines.events import Event
from tests import speech
from tests.ground_truth import audible_onsets
from tests.replay_events import replay_with_events
from tests.test_replay import RATE
from voice.audio import read_wav

GREETING = "Hello, you are through to the assistant. How can I help you today?"


def _call(lead_s: float, tail_s: float) -> tuple[np.ndarray, float]:
    """Silence, one real utterance, silence. Returns the call and the caller's first word's time."""
    clip = speech.librivox()[1]
    pcm, _ = read_wav(clip.path, RATE)
    call = np.concatenate([np.zeros(int(lead_s * RATE), np.int16), pcm, np.zeros(int(tail_s * RATE), np.int16)])
    return call, lead_s + speech.first_word_s(clip)


async def _replay(engines, turn: TurnConfig, pcm: np.ndarray) -> tuple[dict, np.ndarray, list[Event]]:
    return await replay_with_events(Agent(AgentConfig(turn=turn), engines), pcm, RATE)


async def _caller_speaks_after(engines, turn: TurnConfig, said: int, after_s: float) -> dict:
    """A caller who falls silent after one turn, replayed once to find when the agent says its
    ``said``-th own words; then the same call with the caller speaking again ``after_s`` after
    those began. Returns the second call's report."""
    silent, _ = _call(lead_s=1.0, tail_s=20.0)
    report, _, _ = await _replay(engines, turn, silent)
    at = int((report["said"][said]["audio_start_s"] + after_s) * RATE)
    words, _ = read_wav(speech.librivox()[4].path, RATE)
    report, _, _ = await _replay(engines, turn, np.concatenate([silent[:at], words, np.zeros(5 * RATE, np.int16)]))
    return report


@pytest.mark.slow
async def test_the_greeting_plays_as_the_call_starts(engines) -> None:
    pcm, _ = _call(lead_s=5.0, tail_s=5.0)
    report, track, _ = await _replay(engines, TurnConfig(greeting=GREETING), pcm)
    greeting = report["said"][0]
    assert greeting["why"] == "greeting" and greeting["text"] == GREETING and not greeting["interrupted"]
    onsets = audible_onsets(track, RATE)
    assert onsets[0] < 0.2, onsets  # heard at once
    assert len(report["turns"]) == 1 and report["turns"][0]["agent_audio_start_s"] is not None


@pytest.mark.slow
async def test_a_caller_who_talks_over_the_greeting_stops_it_and_is_answered(engines) -> None:
    pcm, first_word = _call(lead_s=1.0, tail_s=5.0)
    report, track, events = await _replay(engines, TurnConfig(greeting=GREETING), pcm)
    assert report["said"][0]["interrupted"]
    stop_s = first_word + TurnConfig().barge_in_min_ms / 1000 + 0.15
    voiced = np.nonzero(np.abs(track.astype(np.int32)) > 64)[0] / RATE
    caller_end = report["turns"][0]["user_speech_end_s"]
    assert not len(voiced[(voiced > stop_s) & (voiced < caller_end)]), "the greeting went on over the caller"
    assert [e.turn for e in events if e.kind == "interrupt"] == [-1]  # type: ignore[attr-defined]
    turn = report["turns"][0]
    assert turn["transcript"] and turn["agent_audio_start_s"] > caller_end


@pytest.mark.slow
async def test_a_silent_caller_is_asked_then_the_agent_says_goodbye_and_hangs_up(engines) -> None:
    pcm, _ = _call(lead_s=1.0, tail_s=20.0)
    turn = TurnConfig(idle_prompt_s=2.0, idle_hangup_after=1)
    report, track, _ = await _replay(engines, turn, pcm)
    assert len(report["turns"]) == 1
    reply_end = report["turns"][0]["agent_audio_end_s"]
    prompt, goodbye = report["said"]
    assert (prompt["why"], prompt["text"]) == ("idle", turn.idle_prompt_text)
    assert (goodbye["why"], goodbye["text"]) == ("goodbye", turn.idle_goodbye_text)
    # asked 2 s after the reply ended, and 2 s after the unanswered prompt the goodbye
    assert 2.0 <= prompt["audio_start_s"] - reply_end < 2.1
    onsets = audible_onsets(track, RATE)
    assert any(abs(t - prompt["audio_start_s"]) < 0.1 for t in onsets), onsets
    assert any(abs(t - goodbye["audio_start_s"]) < 0.1 for t in onsets), onsets
    # the call ends once the goodbye has played, long before the recording does
    assert report["call"]["ended"] == "agent_hangup"
    goodbye_end = np.nonzero(track)[0][-1] / RATE
    assert goodbye_end <= report["call"]["duration_s"] < goodbye_end + 0.1
    assert report["call"]["duration_s"] < len(pcm) / RATE - 5.0


@pytest.mark.slow
async def test_a_caller_who_answers_the_prompt_is_not_hung_up_on(engines) -> None:
    report = await _caller_speaks_after(engines, TurnConfig(idle_prompt_s=2.0, idle_hangup_after=1), 0, 1.8)
    whys = [s["why"] for s in report["said"]]
    assert whys[:1] == ["idle"]
    assert len(report["turns"]) == 2 and report["turns"][1]["agent_audio_start_s"] is not None
    # no goodbye for the prompt they answered; one may come only after another prompt, asked
    # once the answer's reply was over, went unanswered in the rest of the recording
    answered = report["turns"][1]["agent_audio_start_s"]
    if "goodbye" in whys:
        asked_again = report["said"][whys.index("goodbye") - 1]
        assert asked_again["why"] == "idle" and asked_again["audio_start_s"] > answered, report["said"]


@pytest.mark.slow
async def test_a_caller_who_speaks_during_the_goodbye_keeps_the_call(engines) -> None:
    report = await _caller_speaks_after(engines, TurnConfig(idle_prompt_s=2.0, idle_hangup_after=1), 1, 0.3)
    whys = [s["why"] for s in report["said"]]
    assert whys[:2] == ["idle", "goodbye"] and report["said"][1]["interrupted"]
    assert report["call"]["ended"] == "completed" and len(report["turns"]) == 2


def test_greeting_and_idle_settings_are_checked_at_load(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("turn:\n  idle_prompt_s: -1\n")
    with pytest.raises(ConfigError, match="turn.idle_prompt_s"):
        load_config(bad)
    bad.write_text("turn:\n  greeting: ''\n")
    with pytest.raises(ConfigError, match="turn.greeting"):
        load_config(bad)

"""The agent ends its part of the call: it hangs up after the caller's goodbye has been
answered with one (`turn.end_call_on_goodbye`), and not while the caller still has something to
say; a reply that hands the caller over asks the transport for the transfer once heard
(`turn.transfer_to`). Calls of real recorded speech (Allison's "Goodbye" from the Asterisk
prompts, a LibriVox sentence) through the real models; the handoff through the scripted session
of tests/test_turns.py (fake VAD, ASR, LM and TTS: the reply's words are the test's); the phrase
rules on their own. The SIP REFER itself: tests/test_sip_peer.py, with sipp."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.agent import Agent
from pipelines.closing import is_farewell, is_handoff
from pipelines.config import AgentConfig, TurnConfig
from pipelines.replay import replay_pcm
from tests import speech
from tests.ground_truth import audible_onsets
from tests.test_replay import RATE
from tests.test_turns import Seg, make_session, play_script
from voice.audio import read_wav

GRACE_S = 1.0


@pytest.mark.parametrize("text", [
    "Good bye.", "Okay, thanks, bye!", "That's all, thank you.", "Have a great day, goodbye!",
    "Glad I could help. Take care, bye!", "Have a good day.", "No, nothing else. Thanks.", "good-bye",
    "Enjoy the rest of your day.",
])
def test_leave_taking_lines_close_the_conversation(text: str) -> None:
    assert is_farewell(text)


@pytest.mark.parametrize("text", [
    "Bye, wait, can you check my order?", "Is that all?", "Thank you.", "I need a table for two.",
    "Have a look at my bill", "Maybe later.", "", "Nobody answered", "Goodbye? Hello?",
])
def test_other_lines_do_not(text: str) -> None:
    assert not is_farewell(text)


def _goodbye_call(tail_s: float) -> np.ndarray:
    pcm, _ = read_wav(speech.allison("goodbye"), RATE)
    return np.concatenate([np.zeros(RATE, np.int16), pcm, np.zeros(int(tail_s * RATE), np.int16)])


async def _replay(engines, pcm: np.ndarray, on: bool = True) -> tuple[dict, np.ndarray]:
    turn = TurnConfig(end_call_on_goodbye=on, end_call_grace_ms=int(GRACE_S * 1000))
    return await replay_pcm(Agent(AgentConfig(turn=turn), engines), pcm, RATE, fast=True)


@pytest.mark.slow
async def test_the_agent_hangs_up_after_answering_a_goodbye_with_one(engines) -> None:
    report, track = await _replay(engines, _goodbye_call(tail_s=10.0))
    (turn,) = report["turns"]
    assert is_farewell(turn["transcript"]) and is_farewell(turn["response"]), turn
    assert report["call"]["ended"] == "agent_hangup" and report["call"]["hangup"] == "goodbye"
    # the whole goodbye was heard, then the grace, then the line closed (not the 10 s of silence)
    assert not turn["interrupted"]
    end = turn["agent_audio_end_s"]
    assert end + GRACE_S <= report["call"]["duration_s"] <= end + GRACE_S + 0.1
    assert not [t for t in audible_onsets(track, RATE) if t > end], "nothing said after the goodbye"


@pytest.mark.slow
async def test_off_by_default_the_call_goes_on(engines) -> None:
    report, _ = await _replay(engines, _goodbye_call(tail_s=4.0), on=False)
    assert AgentConfig().turn.end_call_on_goodbye is False
    assert report["call"]["ended"] == "completed" and report["call"]["hangup"] is None


@pytest.mark.slow
async def test_a_caller_who_speaks_again_after_the_goodbye_keeps_the_call(engines) -> None:
    first = _goodbye_call(tail_s=10.0)
    report, _ = await _replay(engines, first)
    at = int((report["turns"][0]["agent_audio_end_s"] + GRACE_S / 2) * RATE)
    more, _ = read_wav(speech.librivox()[4].path, RATE)  # "oh, one more thing" in the grace
    report, _ = await _replay(engines, np.concatenate([first[:at], more, np.zeros(5 * RATE, np.int16)]))
    assert report["call"]["ended"] == "completed" and report["call"]["hangup"] is None
    assert len(report["turns"]) == 2 and report["turns"][1]["agent_audio_start_s"] is not None


def test_handoff_lines_say_the_caller_is_handed_over() -> None:
    assert is_handoff("No problem. I'm handing you over to a colleague now.")
    assert is_handoff("Of course. I'll transfer you to a person now, please hold.")
    assert is_handoff("Let me put you through to billing.")
    assert not is_handoff("Shall I transfer you?")
    assert not is_handoff("I can help you with that.")
    assert not is_handoff("The transfer went through yesterday.")


HANDOFF = "No problem. I'm handing you over to a colleague now."
ASK = [Seg(0.5, 1.5, "Can I speak to a real person?")]


async def _handoff(reply: str, transfer_to: str | None, can_transfer: bool,
                   events: list | None = None) -> tuple[dict, float | None]:
    """The scripted call answered with ``reply``; the report, and when the transfer was asked
    (the session's events are added to ``events``)."""
    session, _, seen, responder, _ = make_session(ASK, AgentConfig(turn=TurnConfig(transfer_to=transfer_to)))
    responder.reply = reply
    session.can_transfer = can_transfer
    asked: list[float] = []

    def watch(t: float) -> None:
        if session.transfer_requested.is_set() and not asked:
            asked.append(t)

    await play_script(session, ASK, 8.0, watch)
    report = await session.close()
    if events is not None:
        events.extend(seen)
    return report, (asked[0] if asked else None)


async def test_a_handoff_reply_asks_for_the_transfer_once_it_has_been_heard() -> None:
    report, asked = await _handoff(HANDOFF, "sip:desk@example.com", can_transfer=True)
    turn = report["turns"][0]
    assert turn["response"] == HANDOFF
    assert asked is not None and turn["agent_audio_end_s"] <= asked + 0.02 < turn["agent_audio_end_s"] + 0.1
    transfer = report["call"]["transfer"]
    assert transfer["to"] == "sip:desk@example.com" and transfer["why"] == "handoff"
    assert transfer["result"] is None  # the transport's to answer (SIP: REFER)
    assert report["call"]["hangup"] is None


async def test_no_transfer_without_a_target_a_handoff_or_a_transport_that_can() -> None:
    report, asked = await _handoff(HANDOFF, None, can_transfer=True)
    assert asked is None and report["call"]["transfer"] is None
    report, asked = await _handoff("Sure, I can help with that.", "sip:desk@example.com", can_transfer=True)
    assert asked is None and report["call"]["transfer"] is None
    events: list = []
    report, asked = await _handoff(HANDOFF, "sip:desk@example.com", can_transfer=False, events=events)
    assert asked is None
    assert report["call"]["transfer"]["result"] == "unsupported: replay calls cannot be transferred"
    told = [(e.to, e.why, e.result) for e in events if e.kind == "transfer"]
    assert told == [("sip:desk@example.com", "handoff", None),
                    ("sip:desk@example.com", "handoff", "unsupported: replay calls cannot be transferred")]


def test_transfer_target_must_be_a_sip_or_tel_uri(tmp_path) -> None:
    from pipelines.config import ConfigError, load_config

    (tmp_path / "c.yaml").write_text("turn:\n  transfer_to: desk 12\n")
    with pytest.raises(ConfigError, match="transfer_to"):
        load_config(tmp_path / "c.yaml")


@pytest.mark.slow
async def test_the_real_model_hands_over_a_caller_who_asks_for_a_person(engines) -> None:
    # The caller's words are voiced by Piper (no recording of this request is at hand); the
    # ASR, the LM's reply and the decision are the real ones. Replay cannot transfer, so the
    # report says the transfer was asked for and why it did not happen.
    from voice.audio import resample

    pcm = resample(engines.tts.synth("Can I speak to a real person?"), engines.tts.sample_rate, RATE)
    call = np.concatenate([np.zeros(RATE, np.int16), pcm, np.zeros(5 * RATE, np.int16)])
    agent = Agent(AgentConfig(turn=TurnConfig(transfer_to="sip:desk@example.com")), engines)
    report, _ = await replay_pcm(agent, call, RATE, fast=True)
    (turn,) = report["turns"]
    assert is_handoff(turn["response"]), turn["response"]
    transfer = report["call"]["transfer"]
    assert transfer["why"] == "handoff" and transfer["t"] >= turn["agent_audio_end_s"] - 0.02
    assert transfer["result"] == "unsupported: replay calls cannot be transferred"

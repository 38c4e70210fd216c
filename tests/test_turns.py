"""The turn state machine on scripted timelines: no models are loaded.

Caller speech is scripted as segments; each segment's audio carries a distinct amplitude so
the fakes know which words were "spoken". Stage latencies are scripted by advancing the call
clock, as LiveKit Agents' tests do, so every timing below is deterministic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from llm.decoder import DecodeStats
from llm.responder import Reply
from pipelines.config import AgentConfig, TurnConfig
from pipelines.endpointing import Endpointer, completeness
from pipelines.events import EventBus, Interrupt, SpeculationStarted, Violation
from pipelines.session import CallSession, Engines
from pipelines.speculation import Speculation, covers
from pipelines.transport import AudioClock
from voice.asr import TranscriptResult
from voice.audio import AudioFrame
from voice.transports.replay import TimelineOutput
from voice.tts import split_for_speech
from voice.vad import VadSegmenter

RATE = 16000
FRAME = 320


@dataclass
class Seg:
    start: float
    end: float
    text: str


class FakeWebRtcVad:
    """Voiced = any non-zero sample (the scripted audio is silent or a constant level)."""

    sample_rate = RATE
    frame_ms = 20
    frame_len = FRAME

    def is_speech(self, pcm: np.ndarray) -> bool:
        return bool(np.abs(pcm).max() > 0)


class FakeAsr:
    """Recognises a segment's words from its amplitude (segment k is played at 1000*(k+1))."""

    drafts = False  # takes no draft of the previous hypothesis (WhisperEngine.drafts)
    quick_partials = False  # no thorough= (WhisperEngine.quick_partials)

    def __init__(self, segs: list[Seg], clock: AudioClock | None = None, latency_s: float = 0.0) -> None:
        self.segs = segs
        self.clock = clock
        self.latency_s = latency_s  # scripted transcription time, on ``clock``
        self.calls = 0
        self.heard: list[set[int]] = []  # the segments (1-based) each call's audio contained

    def transcribe(self, audio: np.ndarray, window_s: float | None = None) -> TranscriptResult:
        self.calls += 1
        if self.clock is not None:
            self.clock.t += self.latency_s
        levels = set(np.round(np.abs(audio * 32768) / 1000).astype(int).tolist()) - {0}
        self.heard.append(levels)
        words = [s.text for k, s in enumerate(self.segs) if (k + 1) in levels]
        return TranscriptResult(" ".join(words), 0.0, 8.0)


class FakeResponder:
    def __init__(self, clock: AudioClock, latency_s: float = 0.0, reply: str = "Sure, I can help with that.") -> None:
        self.clock = clock
        self.latency_s = latency_s
        self.reply = reply
        self.calls: list[str] = []
        self.warm_from: list[str | None] = []  # the earlier prompt each call was warm-started from

    async def agenerate(self, text: str, history=(), deadline_s: float | None = None, prev=None) -> Reply:
        self.calls.append(text)
        self.warm_from.append(None if prev is None else prev.prompt)
        self.clock.t += self.latency_s  # scripted stage latency
        await asyncio.sleep(0)
        return Reply(self.reply, [1, 2, 3], [1, 2, 3], [1.0] * 3, DecodeStats(steps=3, step_times=[0.001] * 3), text)


class FakeTts:
    sample_rate = 22050

    def __init__(self, clock: AudioClock, latency_s: float = 0.0) -> None:
        self.clock = clock
        self.latency_s = latency_s
        self.calls = 0

    def split(self, text: str) -> list[str]:
        return split_for_speech(text, 3)

    def synth(self, part: str) -> np.ndarray:
        self.calls += 1
        self.clock.t += self.latency_s
        return np.full(int(0.4 * self.sample_rate * len(part.split())), 5000, dtype=np.int16)


def make_session(
    segs: list[Seg], cfg: AgentConfig | None = None, llm_s: float = 0.0, tts_s: float = 0.0, asr: FakeAsr | None = None
):
    cfg = cfg or AgentConfig()
    clock = AudioClock()
    asr, responder, tts = asr or FakeAsr(segs), FakeResponder(clock, llm_s), FakeTts(clock, tts_s)
    out = TimelineOutput(RATE, clock, cfg.output.buffer_ms)
    bus = EventBus()
    events: list = []
    bus.add_listener(events.append)
    vad = VadSegmenter(FakeWebRtcVad(), cfg.vad.start_ms, cfg.vad.stop_ms)  # type: ignore[arg-type]
    session = CallSession(Engines(asr, responder, tts), cfg, out, clock, bus, vad=vad)  # type: ignore[arg-type]
    return session, out, events, responder, tts


def scripted_frames(segs: list[Seg], total_s: float) -> Iterator[AudioFrame]:
    """The script's 20 ms frames: segment k at level 1000*(k+1), silence elsewhere."""
    for i in range(int(total_s * RATE / FRAME)):
        t = i * FRAME / RATE
        level = next((1000 * (k + 1) for k, s in enumerate(segs) if s.start <= t < s.end), 0)
        yield AudioFrame(np.full(FRAME, level, dtype=np.int16), RATE, t)


async def play_script(
    session: CallSession, segs: list[Seg], total_s: float, after_frame: Callable[[float], None] | None = None
) -> None:
    """Feed the scripted audio frame by frame; ``after_frame(t)`` runs once each frame is handled."""
    await session.start()
    for frame in scripted_frames(segs, total_s):
        await session.push_audio(frame)
        await session.idle()
        if after_frame is not None:
            after_frame(frame.timestamp)


async def play_while_engines_work(session: CallSession, segs: list[Seg], total_s: float) -> None:
    """`play_script` without waiting for the session between frames: frames keep coming (5 ms
    apart) while engines that take real time work, then the session settles."""
    await session.start()
    for frame in scripted_frames(segs, total_s):
        await session.push_audio(frame)
        await asyncio.sleep(0.005)
    await session.idle()


async def test_speculation_hit_plays_prepared_reply_at_once() -> None:
    segs = [Seg(0.5, 2.0, "Can you hear me?")]
    session, out, events, responder, _ = make_session(segs)
    await play_script(session, segs, 4.0)
    report = await session.close()
    (turn,) = report["turns"]
    assert turn["transcript"] == "Can you hear me?"
    assert turn["speculation"]["used"] and turn["speculation"]["hit"]
    assert responder.calls == ["Can you hear me?"]  # generated once, speculatively
    assert turn["endpoint"]["reason"] == "complete"
    # endpoint at min_silence after the pause; nothing left to compute then: gap = silence + buffer
    assert turn["gap_ms"] <= AgentConfig().vad.stop_ms + AgentConfig().turn.min_silence_ms + 60
    assert any(isinstance(e, SpeculationStarted) for e in events)


class SlowFakeResponder(FakeResponder):
    """A fake LM (this test isolates the turn logic) whose reply takes real time, so the turn
    can commit while a speculation's reply is still being computed. Its turn-end opinion
    (``turn_end_prob``, in a worker thread) takes real time too and always says "whole"."""

    turn_end = True

    def turn_end_prob(self, text: str) -> float:
        time.sleep(0.01)
        return 0.99

    async def agenerate(self, text: str, history=(), deadline_s: float | None = None, prev=None) -> Reply:
        await asyncio.sleep(0.02)
        return await super().agenerate(text, history, deadline_s, prev)


class RecordingFakeTts(FakeTts):
    def __init__(self, clock: AudioClock) -> None:
        super().__init__(clock)
        self.said: list[str] = []

    def synth(self, part: str) -> np.ndarray:
        self.said.append(part)
        time.sleep(0.01)  # real synthesis takes time in its worker thread
        return super().synth(part)


class RealTimeFakeAsr(FakeAsr):
    """FakeAsr whose transcription takes real time in its worker thread, so frames go on
    arriving while it runs (the fakes above finish before the next frame)."""

    def transcribe(self, audio: np.ndarray, window_s: float | None = None) -> TranscriptResult:
        time.sleep(0.06)
        return super().transcribe(audio, window_s)


async def test_a_reply_landing_at_the_commit_has_its_first_clause_synthesised_once() -> None:
    # the final words come with the tail partial, which lands after the VAD's pause: the turn
    # commits at once while that partial's speculative reply is still running, and the
    # committed path must take the speculation's first clause rather than synthesise it again
    segs = [Seg(0.5, 2.0, "I need a table for two.")]
    cfg = AgentConfig.model_validate({"asr": {"partial_interval_ms": 5000}})  # the tail partial alone
    session, out, events, responder, _ = make_session(segs, cfg, asr=RealTimeFakeAsr(segs))
    slow, tts = SlowFakeResponder(session.clock), RecordingFakeTts(session.clock)  # type: ignore[arg-type]
    session.engines.responder, session.engines.tts = slow, tts  # type: ignore[misc]
    await play_while_engines_work(session, segs, 4.0)
    report = await session.close()
    (turn,) = report["turns"]
    assert slow.calls == ["I need a table for two."]  # one reply: the speculation's, reused
    assert tts.said == split_for_speech(slow.reply, 3), tts.said  # each clause once: the first not twice


async def test_a_partial_the_caller_talked_past_starts_no_speculation() -> None:
    # "I need a taxi." reads as finished, but the caller is still speaking when its partial
    # lands: answering it would be work for nothing (at four calls on two cores, such replies
    # were most of the speculative work). Only words the caller may have stopped at are answered.
    segs = [Seg(0.5, 1.3, "I need a taxi."), Seg(1.3, 3.0, "to the station please.")]
    session, out, events, responder, _ = make_session(segs, asr=RealTimeFakeAsr(segs))
    await play_while_engines_work(session, segs, 5.0)
    report = await session.close()
    (turn,) = report["turns"]
    assert turn["transcript"] == "I need a taxi. to the station please."
    assert any(p["text"] == "I need a taxi." for p in turn["partials"])  # it was heard, mid-speech
    starts = turn["speculation"]["started"]
    assert starts and all(s["t"] >= 3.0 for s in starts if s["on"] == "partial"), starts
    assert responder.calls == ["I need a taxi. to the station please."]  # answered once, whole


@pytest.mark.parametrize("tail_ms", [40, 0])
async def test_tail_partial_is_the_final_transcript(tail_ms: int) -> None:
    segs = [Seg(0.5, 2.0, "Can you hear me?")]
    cfg = AgentConfig.model_validate({"asr": {"partial_interval_ms": 5000, "tail_partial_ms": tail_ms}})
    session, out, events, responder, _ = make_session(segs, cfg)
    asr = session.engines.asr
    await play_script(session, segs, 4.0)
    report = await session.close()
    (turn,) = report["turns"]
    assert turn["transcript"] == "Can you hear me?" and turn["speculation"]["hit"]
    first_t = turn["partials"][0]["t"]
    if tail_ms:
        # 40 ms after the last voiced frame, before the VAD reports the pause (80 ms) ...
        assert first_t == pytest.approx(2.0 + 0.04, abs=0.021)
        # ... and the pause and the final reuse it: the whole turn cost one ASR run
        assert asr.calls == 1
    else:
        assert first_t >= 2.0 + cfg.vad.stop_ms / 1000 - 1e-6  # only the pause hypothesis


async def test_turn_commits_when_its_final_transcript_lands_not_at_the_next_frame() -> None:
    # no tail partial: the pause's own hypothesis is the final transcript; it lands 5 ms after
    # the frame that reported the pause, when the silence already suffices for a question
    segs = [Seg(0.5, 2.0, "Can you hear me?")]
    cfg = AgentConfig.model_validate({"asr": {"partial_interval_ms": 5000, "tail_partial_ms": 0}})
    session, *_ = make_session(segs, cfg)
    session.engines.asr.clock, session.engines.asr.latency_s = session.clock, 0.005
    await play_script(session, segs, 3.0)
    report = await session.close()
    (turn,) = report["turns"]
    pause_frame_end = 2.0 + cfg.vad.stop_ms / 1000
    assert turn["endpoint"]["t"] == pytest.approx(pause_frame_end + 0.005, abs=1e-3)  # not 20 ms later
    assert turn["gap_ms"] == pytest.approx(cfg.vad.stop_ms + 5 + cfg.output.buffer_ms, abs=1.5)


@pytest.mark.parametrize(("firsts", "heard_last"), [
    ([(0.5, 4.0, "I would like a table for two,")], {2}),
    # "... in | his power" heard alone came back as "It's power to do for them. It is power":
    # the rest of a phrase is transcribed with its start, from the last pause that was no such place
    ([(0.5, 4.0, "how much might be prudently in")], {1, 2}),
    ([(0.5, 2.0, "I was thinking"), (2.3, 4.0, "how much might be prudently in")], {2, 3}),
])
async def test_long_turn_is_cut_at_a_pause_and_only_the_rest_is_transcribed(
    firsts: list[tuple[float, float, str]], heard_last: set[int]
) -> None:
    segs = [Seg(*f) for f in firsts] + [Seg(4.5, 5.2, "at seven.")]
    # the cut's mechanics on a short script: cut once 3 s of the turn lie before a pause (the
    # default waits for 8 s, docs/asr.md)
    cfg = AgentConfig.model_validate({"asr": {"segment_after_s": 3.0}})
    session, out, events, responder, _ = make_session(segs, cfg)
    asr = session.engines.asr
    await play_script(session, segs, 7.5)
    report = await session.close()
    (turn,) = report["turns"]
    assert turn["transcript"] == " ".join(s.text for s in segs)
    assert asr.heard[-1] == heard_last  # after the cut, the audio before it was never sent again
    cut = min(heard_last) - 1  # segments before the cut
    assert all(set(range(1, cut + 1)) <= h for h in asr.heard if not h & set(range(cut + 1, len(segs) + 1)))


async def test_speculation_on_stale_audio_is_wasted_and_never_enters_history() -> None:
    segs = [Seg(0.5, 1.5, "I need"), Seg(1.75, 2.5, "a taxi please.")]
    cfg = AgentConfig()
    session, out, events, responder, _ = make_session(segs, cfg)
    await play_script(session, segs, 4.5)
    report = await session.close()
    (turn,) = report["turns"]
    assert turn["transcript"] == "I need a taxi please."
    assert len(turn["speculation"]["started"]) >= 2  # at least one per pause (and on complete-looking partials)
    assert turn["speculation"]["hit"]
    assert session.history == [("I need a taxi please.", responder.reply)]
    # the block for the longer hypothesis was warm-started from the one for "I need"
    assert responder.calls[0] == "I need" and responder.warm_from[0] is None
    assert "I need" in responder.warm_from[1:] and turn["speculation"]["warm_starts"] >= 1


async def test_redenoise_off_always_starts_from_masks() -> None:
    segs = [Seg(0.5, 1.5, "I need"), Seg(1.75, 2.5, "a taxi please.")]
    cfg = AgentConfig.model_validate({"turn": {"redenoise": False}})
    session, out, events, responder, _ = make_session(segs, cfg)
    await play_script(session, segs, 4.5)
    report = await session.close()
    assert len(responder.calls) >= 2 and responder.warm_from == [None] * len(responder.calls)
    assert report["turns"][0]["speculation"]["warm_starts"] == 0


async def test_no_cutoff_when_caller_pauses_after_a_function_word() -> None:
    segs = [Seg(0.5, 1.5, "I want to go to the"), Seg(2.1, 2.6, "store.")]  # 600 ms mid-sentence pause
    session, *_ = make_session(segs)
    await play_script(session, segs, 5.0)
    report = await session.close()
    assert [t["transcript"] for t in report["turns"]] == ["I want to go to the store."]


async def test_a_lone_voiced_frame_in_a_pause_does_not_leave_the_turn_unanswered() -> None:
    # a click 500 ms into the pause after "the": one voiced frame, not a VAD speech start
    segs = [Seg(0.5, 1.5, "I want to go to the"), Seg(2.0, 2.02, "uh")]
    asr = FakeAsr(segs)
    session, out, *_ = make_session(segs, asr=asr)
    await play_script(session, segs, 5.0)
    report = await session.close()
    # the click's audio is the turn's: the final transcript hears it
    assert [t["transcript"] for t in report["turns"]] == ["I want to go to the uh"]
    assert asr.heard[-1] == {1, 2}
    turn = report["turns"][0]
    # the pause's silence counts from the click: the function word's wait runs after it
    wait = Endpointer(AgentConfig().turn).required_silence_ms("I want to go to the") / 1000
    assert turn["endpoint"]["t"] >= 2.02 + wait - 0.02 and turn["agent_audio_start_s"] < 2.02 + wait + 0.2


async def test_cutoff_taken_back_when_caller_goes_on_before_reply_is_heard() -> None:
    # "Hello." looks complete and commits; the caller goes on 150 ms later, before any audio
    segs = [Seg(0.5, 1.2, "Hello."), Seg(1.55, 2.4, "is this the help desk?")]
    cfg = AgentConfig()
    cfg.turn.speculation = False
    session, out, events, responder, _ = make_session(segs, cfg, llm_s=0.3)

    def asr_keeps_the_call_clock(t: float) -> None:
        if 1.8 <= t < 2.3:  # the turn goes on: the ASR buffer holds every sample up to now
            assert session.asr.audio_end == pytest.approx(t + FRAME / RATE, abs=1e-6)

    await play_script(session, segs, 5.0, asr_keeps_the_call_clock)
    report = await session.close()
    assert session.cutoffs_recovered == 1
    assert len(report["turns"]) == 1 and report["turns"][0]["transcript"] == "Hello. is this the help desk?"


async def _frame_before_reply(segs: list[Seg], cfg: AgentConfig) -> float:
    """The start of the 20 ms frame before the one in which the reply to ``segs`` alone first
    sounds."""
    session, *_ = make_session(segs, cfg)
    await play_script(session, segs, 4.0)
    start = (await session.close())["turns"][0]["agent_audio_start_s"]
    return round(start / 0.02) * 0.02 - 0.02


@pytest.mark.parametrize("on_voiced", [True, False])
async def test_reply_is_withdrawn_at_the_callers_first_voiced_frame(on_voiced: bool) -> None:
    # "Hello." commits; the caller goes on in the frame its reply starts to sound in
    cfg = AgentConfig()
    cfg.turn.takeback_on_voiced = on_voiced
    first = [Seg(0.5, 1.2, "Hello.")]
    on = await _frame_before_reply(first, cfg)
    segs = [*first, Seg(on, on + 0.8, "is this the help desk?")]
    session, out, *_ = make_session(segs, cfg)
    await play_script(session, segs, 5.0)
    report = await session.close()
    assert session.cutoffs_recovered == 1
    assert [t["transcript"] for t in report["turns"]] == ["Hello. is this the help desk?"]
    heard = np.nonzero(out.track[int(on * RATE): int((on + 0.5) * RATE)])[0]
    heard_s = (heard.max() - heard.min() + 1) / RATE
    buffer_s = cfg.output.buffer_ms / 1000
    if on_voiced:  # withdrawn at that frame: only what the output buffer held still played
        assert heard_s <= buffer_s + 1e-6
    else:  # stopped at the VAD's speech start, two frames later
        assert buffer_s < heard_s <= cfg.vad.start_ms / 1000 + buffer_s


async def test_a_click_just_after_the_commit_withdraws_the_reply_and_the_turn_is_answered_after_the_wait() -> None:
    cfg = AgentConfig()
    first = [Seg(0.5, 1.2, "Hello.")]
    click = await _frame_before_reply(first, cfg)
    segs = [*first, Seg(click, click + 0.02, "")]  # one voiced frame, no VAD speech start
    session, *_ = make_session(segs, cfg)
    await play_script(session, segs, 5.0)
    report = await session.close()
    assert session.cutoffs_recovered == 1
    assert len(report["turns"]) == 1 and report["turns"][0]["transcript"].strip() == "Hello."
    # committed again once the rule's wait has run from the click
    wait = Endpointer(cfg.turn).required_silence_ms("Hello.") / 1000
    assert report["turns"][0]["agent_audio_start_s"] >= click + 0.02 + wait - 0.02


async def test_barge_in_stops_agent_audio_and_keeps_only_heard_part() -> None:
    cfg = AgentConfig()
    long_reply = "Let me explain the whole process to you step by step, it takes a while. First you log in."
    segs = [Seg(0.5, 1.5, "How does it work?"), Seg(3.0, 4.0, "Stop, stop.")]
    session, out, events, responder, tts = make_session(segs, cfg)
    responder.reply = long_reply
    await play_script(session, segs, 6.0)
    report = await session.close()
    first = report["turns"][0]
    assert first["interrupted"]
    heard = first["heard_response"]
    assert heard and len(heard.split()) < len(long_reply.split())
    assert session.history[0] == (first["transcript"], heard)
    (intr,) = [e for e in events if isinstance(e, Interrupt)]
    onset = segs[1].start
    # the interruption fires once the caller has spoken barge_in_min_ms, and audio stops within 100 ms
    assert intr.t - (onset + cfg.turn.barge_in_min_ms / 1000) <= 0.1
    second = report["turns"][1]["agent_audio_start_s"] if len(report["turns"]) > 1 else 5.9
    after = out.track[int((intr.t + cfg.output.buffer_ms / 1000 + 0.01) * RATE) : int(second * RATE)]
    assert not np.any(after == 5000)  # no agent audio of the first reply after the cut


async def test_backchannel_does_not_interrupt() -> None:
    cfg = AgentConfig()
    segs = [Seg(0.5, 1.5, "Tell me a story."), Seg(2.6, 2.75, "uh-huh")]
    session, out, events, responder, _ = make_session(segs, cfg)
    responder.reply = "Once upon a time there was a small town by the sea, and people there loved boats."
    await play_script(session, segs, 7.0)
    report = await session.close()
    assert not any(isinstance(e, Interrupt) for e in events)
    assert len(report["turns"]) == 1 and not report["turns"][0]["interrupted"]


async def test_budget_overrun_is_a_violation_event() -> None:
    cfg = AgentConfig()
    cfg.turn.speculation = False  # the reply is generated after the endpoint: its latency counts
    segs = [Seg(0.5, 1.5, "What time is it?")]
    session, out, events, *_ = make_session(segs, cfg, llm_s=0.12, tts_s=0.05)
    await play_script(session, segs, 3.0)
    report = await session.close()
    (turn,) = report["turns"]
    stages = {v["stage"]: v for v in turn["violations"]}
    assert stages["llm_block"]["over_ms"] == pytest.approx(120 - cfg.budgets.llm_block_ms, abs=1)
    assert stages["tts_first_audio"]["over_ms"] == pytest.approx(50 - cfg.budgets.tts_first_audio_ms, abs=1)
    assert {e.stage for e in events if isinstance(e, Violation)} >= {"llm_block", "tts_first_audio"}
    assert report["summary"]["violations"] == len(turn["violations"])


def test_update_budgets_validates_and_changes_nothing_on_error() -> None:
    session, *_ = make_session([])
    before = session.budgets
    from pipelines.config import ConfigError

    with pytest.raises(ConfigError):
        session.update_budgets({"llm_block_ms": -5})
    assert session.budgets == before
    session.update_budgets({"llm_block_ms": 30})
    assert session.budgets.llm_block_ms == 30


def test_endpointer_waits_longer_after_function_words_and_adapts() -> None:
    cfg = AgentConfig().turn
    ep = Endpointer(cfg)
    assert completeness("Can you hear me?") >= 0.9
    assert completeness("I was looking for the") < 0.2
    assert completeness("um") < 0.2
    assert ep.required_silence_ms("Thanks.") == cfg.min_silence_ms
    assert ep.required_silence_ms("I need a") > 5 * cfg.min_silence_ms
    for _ in range(6):
        ep.caller_resumed_after(60, "I went home.")  # dips between words: never a turn end
        ep.caller_resumed_after(400, "I went to the")  # expected after a function word
    assert ep.required_silence_ms("Thanks.") == cfg.min_silence_ms
    for _ in range(6):
        ep.caller_resumed_after(300, ".")  # a breath Whisper heard as a lone full stop: no words
    assert ep.required_silence_ms("Thanks.") == cfg.min_silence_ms
    for _ in range(6):
        ep.caller_resumed_after(300, "I went home.")  # looked finished, and they went on
    assert ep.required_silence_ms("Thanks.") > cfg.min_silence_ms
    # unless the words and the LM together leave no doubt
    assert ep.required_silence_ms("Thanks.", lm_prob=0.7) == cfg.min_silence_ms
    assert ep.required_silence_ms("Thanks", lm_prob=0.7) > cfg.min_silence_ms  # bare words at 0.7: some doubt
    assert ep.required_silence_ms("so") <= cfg.max_silence_ms


class FakeResponderWithTurnEnd(FakeResponder):
    """A fake responder that also gives scripted LM turn-end probabilities."""

    def __init__(self, clock: AudioClock, probs: dict[str, float]) -> None:
        super().__init__(clock)
        self.probs = probs
        self.turn_end = object()  # the session only checks that a probe exists
        self.asked: list[str] = []

    def turn_end_prob(self, text: str) -> float:
        self.asked.append(text)
        return self.probs.get(text, 0.5)


async def test_a_question_or_trailing_function_word_does_not_wait_for_the_lm() -> None:
    segs = [Seg(0.5, 1.5, "Can you hear me?"), Seg(3.0, 3.8, "I want to go to the")]
    session, *_ = make_session(segs)
    fake = FakeResponderWithTurnEnd(session.clock, {})
    session.engines.responder = fake  # type: ignore[assignment]
    await play_script(session, segs, 6.0)
    report = await session.close()
    turns = report["turns"]
    assert turns[0]["endpoint"]["reason"] == "complete"
    assert turns[0]["endpoint"]["silence_ms"] <= AgentConfig().turn.min_silence_ms + 20
    assert fake.asked == []  # the LM cannot overrule those endings: its probe never ran
    ep = Endpointer(AgentConfig().turn, resumed_pauses=[300.0] * 6)
    # a caller who often goes on after complete-looking pauses: a question is still not stretched
    assert ep.required_silence_ms("Can you hear me?") == AgentConfig().turn.min_silence_ms
    assert ep.required_silence_ms("I went home.") > AgentConfig().turn.min_silence_ms


@pytest.mark.parametrize(("prob", "waits"), [(0.1, True), (0.9, False)])
async def test_lm_turn_end_probability_moves_the_wait(prob: float, waits: bool) -> None:
    segs = [Seg(0.5, 1.5, "I went home.")]  # Whisper's full stop: punctuation alone says finished
    session, out, events, _, tts = make_session(segs)
    session.engines.responder = FakeResponderWithTurnEnd(session.clock, {"I went home.": prob})  # type: ignore[assignment]
    await play_script(session, segs, 4.0)
    report = await session.close()
    (turn,) = report["turns"]
    assert turn["endpoint"]["lm_turn_end_prob"] == prob
    min_ms = AgentConfig().turn.min_silence_ms
    if waits:  # the LM reads a fragment: wait longer than a finished turn would
        assert turn["endpoint"]["silence_ms"] > 2 * min_ms and turn["endpoint"]["reason"] == "incomplete-wait"
    else:
        assert turn["endpoint"]["silence_ms"] <= min_ms + 20 and turn["endpoint"]["reason"] == "complete"


class FakeAsrNearlyHeard(FakeAsr):
    """A fake ASR that drops a short last word but reports it as nearly written
    (`TranscriptResult.near_next`), as Whisper read "...prudently" with " in" at 0.49."""

    def __init__(self, segs: list[Seg], near: dict[str, tuple[str, float]]) -> None:
        super().__init__(segs)
        self.near = near

    def transcribe(self, audio: np.ndarray, window_s: float | None = None) -> TranscriptResult:
        r = super().transcribe(audio, window_s)
        if r.text in self.near:
            r.near_next, r.near_share = self.near[r.text]
        return r


@pytest.mark.parametrize("share", [0.49, 0.0])
async def test_no_cutoff_or_cut_where_whisper_nearly_wrote_a_function_word(share: float) -> None:
    first = "how much there might be prudently"  # the caller said "...prudently in", then paused
    segs = [Seg(0.5, 4.0, first), Seg(4.5, 5.2, "his power to do for them.")]
    asr = FakeAsrNearlyHeard(segs, {first: ("in", share)} if share else {})
    session, *_ = make_session(segs, asr=asr)
    await play_script(session, segs, 7.0)
    report = await session.close()
    transcripts = [t["transcript"] for t in report["turns"]]
    if share:  # neither committed at the pause nor cut there: the last call heard both segments
        assert transcripts == [f"{first} his power to do for them."]
        assert session.cutoffs_recovered == 0 and asr.heard[-1] == {1, 2}
    else:  # bare words, an even chance: the 500 ms pause ended the turn, the reply began, and
        # the caller going on right after it (``turn.takeback_ms``) stopped it: one turn, answered whole
        assert transcripts == [f"{first} his power to do for them."]
        assert session.cutoffs_recovered == 1


def test_a_function_word_whisper_nearly_wrote_counts_as_written() -> None:
    # "...prudently" at a pause after "in": Whisper gave end-of-text 0.51 and " in" 0.49
    ep = Endpointer(AgentConfig().turn)
    min_ms = AgentConfig().turn.min_silence_ms
    text = "how much there might be prudently"
    assert ep.required_silence_ms(text, lm_prob=0.9) == min_ms
    assert ep.required_silence_ms(text, lm_prob=0.9, near=("in", 0.49)) == ep.required_silence_ms("be prudently in")
    assert ep.required_silence_ms(text, lm_prob=0.9, near=("in", 0.2)) == min_ms  # far less likely than the end
    assert ep.required_silence_ms(text, lm_prob=0.9, near=("money", 0.49)) == min_ms  # not a function word
    assert ep.required_silence_ms("Thanks.", near=(",", 0.45)) == min_ms  # punctuation is no word
    # a new sentence Whisper nearly began ("...young man? He", 0.41 in a real replay) does not
    # make this one unfinished
    assert ep.required_silence_ms("he was not an ill-disposed young man?", near=("He", 0.41)) == min_ms
    assert ep.required_silence_ms(f"{text}.", lm_prob=0.9, near=("The", 0.45)) == min_ms
    assert ep.required_silence_ms("Is that so?", near=("and", 0.45)) == min_ms
    ep.caller_resumed_after(300, text, 0.9, near=("in", 0.49))  # an unfinished-looking pause: not counted
    assert ep.resumed_pauses == []


def test_lm_probability_cannot_overrule_a_trailing_function_word() -> None:
    ep = Endpointer(AgentConfig().turn)
    min_ms = AgentConfig().turn.min_silence_ms
    assert completeness("I want to go to the", lm_prob=0.99) < 0.2
    assert completeness("He might even have.", lm_prob=0.99) < 0.2  # an auxiliary waiting for its verb
    assert completeness("Can you hear me?", lm_prob=0.01) >= 0.9
    assert ep.required_silence_ms("I went home", lm_prob=0.9) == min_ms  # no punctuation, the LM is sure
    # a full stop the LM reads as a fragment waits several times longer
    assert ep.required_silence_ms("I went home.", lm_prob=0.1) > 3 * min_ms
    assert ep.required_silence_ms("I went home.", lm_prob=0.1) > ep.required_silence_ms("I went home.", lm_prob=0.5)
    # words that often end a sentence are left to punctuation and the LM
    for done in ("Thank you.", "I think so.", "More respectable than he was.", "Yes, I can.", "I love it."):
        assert ep.required_silence_ms(done) == min_ms, done


async def test_fallback_covers_a_slow_turn_and_is_counted_separately() -> None:
    cfg = AgentConfig()
    cfg.turn.speculation = False
    cfg.turn.fallback = True
    segs = [Seg(0.5, 1.5, "What's my balance?")]
    session, out, events, *_ = make_session(segs, cfg, llm_s=0.4)
    await play_script(session, segs, 4.0)
    report = await session.close()
    (turn,) = report["turns"]
    assert turn["first_audio"] == "fallback"
    assert turn["first_content_audio_s"] - turn["agent_audio_start_s"] >= 0.3
    assert report["summary"]["fallbacks"] == 1


async def test_wasted_compute_stops_counting_when_the_speculation_finished() -> None:
    async def hypothesis() -> str:
        await asyncio.sleep(0.05)
        return "I need a taxi."

    spec = Speculation(samples=16000, started_t=0.0, asr=asyncio.ensure_future(hypothesis()))
    await spec.asr
    await asyncio.sleep(0.3)  # finished long ago: cancelling it now wastes nothing more
    assert 0.04 <= spec.cancel() < 0.2

    slow = Speculation(samples=16000, started_t=0.0, asr=asyncio.ensure_future(asyncio.sleep(10)))
    await asyncio.sleep(0.1)
    assert slow.cancel() >= 0.09  # still running: it worked until now


@pytest.mark.parametrize("end_s", [1.0, 1.08, 1.1, 1.32, 1.58, 1.62])
async def test_a_turn_commits_on_the_frame_its_wait_runs_out(end_s: float) -> None:
    # call times are float sums of frames: at these ends the silence read 79.99999 ms on the
    # frame where the 80 ms wait ran out, and the turn committed a frame (20 ms) later
    segs = [Seg(0.5, end_s, "Thanks.")]
    session, *_ = make_session(segs)
    await play_script(session, segs, end_s + 1.5)
    (turn,) = (await session.close())["turns"]
    assert turn["endpoint"]["reason"] == "complete"
    assert turn["endpoint"]["silence_ms"] == turn["endpoint"]["required_ms"] == AgentConfig().turn.min_silence_ms


def test_audio_covers_the_last_voiced_frame_despite_float_sums() -> None:
    audio_end = 0.0
    for _ in range(550):
        audio_end += FRAME / RATE  # 11 s of frames summed one by one: not exactly 11.0
    assert audio_end != 11.0
    assert covers(audio_end, 11.0) and covers(11.0, audio_end)
    assert not covers(11.0 - 0.02, 11.0)  # a whole frame short does not cover


def test_stage_violations_name_the_stage_and_the_ms_over() -> None:
    from pipelines.budgets import stage_violations

    budgets = AgentConfig().budgets
    stages = {"vad_endpoint": 120.0, "asr_final": 10.0, "llm_block": 40.0, "tts_first_audio": 20.04,
              "output": 25.04}
    got = stage_violations(stages, budgets)
    # at the budget is not over it, nor is less over it than the report's 0.1 ms
    assert [v["stage"] for v in got] == ["vad_endpoint", "output"]
    assert got[0] == {"stage": "vad_endpoint", "budget_ms": budgets.endpoint_ms, "actual_ms": 120.0, "over_ms": 40.0}


def test_smart_turn_and_the_words_must_agree_before_the_shortest_wait() -> None:
    cfg = TurnConfig(adapt_to_caller=False)
    ep = Endpointer(cfg)
    done = "I need a new card."
    assert ep.required_silence_ms(done, lm_prob=0.9, audio_prob=0.95) == cfg.agree_silence_ms
    # the sound says the caller is mid-sentence: the pause is waited out
    assert ep.required_silence_ms(done, lm_prob=0.9, audio_prob=0.2) == cfg.disagree_silence_ms
    # the sound says done, the words are a fragment
    assert ep.required_silence_ms("Your call", lm_prob=0.1, audio_prob=0.95) == cfg.disagree_silence_ms
    # a trailing function word waits the longest, whatever the sound says
    assert ep.required_silence_ms("I would like to book the", audio_prob=0.99) == cfg.incomplete_silence_ms
    # no words yet, or an older partial that may miss the last ones: doubt, however sure the sound
    assert ep.required_silence_ms(None, audio_prob=0.99) == cfg.disagree_silence_ms
    assert ep.required_silence_ms(done, stale=True, audio_prob=0.99) == cfg.disagree_silence_ms
    assert ep.required_silence_ms("I would like to book the", stale=True, audio_prob=0.99) == cfg.incomplete_silence_ms

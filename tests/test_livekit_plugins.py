"""Our engines as livekit-agents plugins, run through the real livekit-agents code.

No LiveKit server exists here, so the end-to-end test runs an `AgentSession` with our own
`AudioInput`/`AudioOutput` and no room, replaying recorded speech in real time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from livekit import rtc
from livekit.agents import llm, stt

from pipelines.config import AgentConfig
from pipelines.livekit_plugins import (
    DiffusionLLM,
    PiperStreamingTTS,
    WhisperSTT,
    livekit_plugins_for,
    run_livekit_session,
)
from pipelines.livekit_plugins.llm_diffusion import conversation
from pipelines.livekit_plugins.session_replay import gaps
from pipelines.livekit_plugins.tts_piper import complete_sentences
from tests.speech import librivox
from voice.asr import normalize_words
from voice.audio import read_wav, resample
from voice.tts import first_sentence_ready
from voice.vad import WebRtcVad
from voice.workers import EngineWorkers

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]


def _agent_available() -> bool:
    try:
        import pipelines.agent  # noqa: F401
    except ImportError:
        return False
    return True


needs_agent = pytest.mark.skipif(not _agent_available(), reason="pipelines.agent is not available yet")


def recall(said: str, reference: str) -> float:
    ref = normalize_words(reference)
    got = set(normalize_words(said))
    return sum(w in got for w in ref) / max(1, len(ref))


def quiet(s: float) -> np.ndarray:
    return np.zeros(int(16000 * s), np.int16)


def room_frames(pcm16: np.ndarray) -> list[rtc.AudioFrame]:
    """What a LiveKit room hands an STT: 10 ms frames at 48 kHz."""
    pcm48 = resample(pcm16, 16000, 48000)
    return [rtc.AudioFrame(pcm48[i : i + 480].tobytes(), 48000, 1, 480) for i in range(0, len(pcm48) - 479, 480)]


def voiced_seconds(pcm16k: np.ndarray) -> float:
    vad = WebRtcVad(2, 16000, 20)
    return sum(vad.is_speech(pcm16k[i : i + 320]) for i in range(0, len(pcm16k) - 319, 320)) * 0.02


# pure helpers


async def test_complete_sentences_keeps_the_unfinished_rest() -> None:
    assert complete_sentences("Hello there. How are") == ("Hello there.", "How are")
    assert complete_sentences("Hi! Fine? ") == ("Hi! Fine?", "")
    assert complete_sentences("no end yet") == ("", "no end yet")
    assert complete_sentences('He said "go." Then') == ('He said "go."', "Then")


async def test_conversation_takes_the_last_user_message_and_pairs_history() -> None:
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="system", content="be nice")
    ctx.add_message(role="user", content="hi")
    ctx.add_message(role="assistant", content="hello")
    ctx.add_message(role="user", content="how are")
    ctx.add_message(role="user", content="you")
    assert conversation(ctx) == ("how are you", [("hi", "hello")])
    empty = llm.ChatContext.empty()
    empty.add_message(role="assistant", content="welcome")
    assert conversation(empty) == ("", [])


async def test_gaps_pair_each_reply_with_the_speech_before_it() -> None:
    ends = np.array([1.0, 1.02, 1.04, 5.0, 5.02])
    assert gaps([1.8, 2.5, 5.6], ends) == [(1.04, 1.8), (5.02, 5.6)]  # 2.5: the same reply, second part
    assert gaps([0.5], ends) == []  # the agent spoke first: no caller turn


# the plugins on real speech


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def agent() -> AsyncIterator[Any]:
    if not _agent_available():
        pytest.skip("pipelines.agent is not available yet")
    from pipelines.agent import Agent

    yield await Agent.load(AgentConfig())


class RecordingEngine:
    """The real Whisper engine behind a recorder (not a fake: every call runs the engine), on
    its own one-thread pool: which thread ran each transcription, and with what ``thorough``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.cfg, self.drafts, self.quick_partials = engine.cfg, engine.drafts, engine.quick_partials
        self.workers = EngineWorkers("recorded-asr", threads=1)
        self.calls: list[tuple[str, bool]] = []

    def transcribe(self, audio: np.ndarray, **kwargs: Any) -> Any:
        self.calls.append((threading.current_thread().name, kwargs.get("thorough", True)))
        return self.engine.transcribe(audio, **kwargs)


@needs_agent
async def test_stt_stream_emits_interim_preflight_final_on_real_speech(agent: Any) -> None:
    clip = librivox()[1]  # "he was not an ill disposed young man"
    pcm, _ = read_wav(clip.path, 16000)
    engine = RecordingEngine(agent.asr_engine)
    plugin = WhisperSTT(engine, asr=agent.cfg.asr, vad=agent.cfg.vad)  # type: ignore[arg-type]
    assert plugin.capabilities.streaming and plugin.capabilities.interim_results
    stream = plugin.stream()
    events: list[stt.SpeechEvent] = []

    async def read() -> None:
        async for ev in stream:
            events.append(ev)

    reader = asyncio.ensure_future(read())
    for frame in room_frames(np.concatenate([quiet(0.5), pcm, quiet(1.0)])):
        stream.push_frame(frame)
        await asyncio.sleep(0.01)  # real time: LiveKit delivers 10 ms frames
    stream.end_input()
    await asyncio.wait_for(reader, 30)
    kinds = [e.type for e in events if e.type != stt.SpeechEventType.RECOGNITION_USAGE]
    T = stt.SpeechEventType
    assert kinds[0] == T.START_OF_SPEECH and kinds[-2:] == [T.FINAL_TRANSCRIPT, T.END_OF_SPEECH]
    assert T.INTERIM_TRANSCRIPT in kinds and kinds.count(T.FINAL_TRANSCRIPT) == 1
    final = next(e for e in events if e.type == T.FINAL_TRANSCRIPT)
    assert recall(final.alternatives[0].text, clip.text) >= 0.6, final.alternatives[0].text
    assert final.speech_end_time is not None and final.speech_end_time <= final.created_at
    # times on the stream's timeline: the clip starts after 0.5 s of quiet and ends with 1 s of it
    alt = final.alternatives[0]
    assert 0.1 <= alt.start_time <= 0.6, alt.start_time  # the pre-roll kept from before the VAD fired
    assert abs(alt.end_time - (0.5 + len(pcm) / 16000)) < 0.3, alt.end_time
    preflights = [e for e in events if e.type == T.PREFLIGHT_TRANSCRIPT]
    for p in preflights:  # a preflight is the caller's words at a pause: the final, or a prefix of it
        assert normalize_words(final.alternatives[0].text)[: len(normalize_words(p.alternatives[0].text))]
    await stream.aclose()
    engine.workers.shutdown()
    # Whisper ran on the engine's pool, never on asyncio's shared executor; the interims, which
    # nobody waits on, skipped the 30 s window's checks, and the final's hypothesis did not
    assert engine.calls and all(name.startswith("engine-recorded-asr") for name, _ in engine.calls), engine.calls
    assert (False in (t for _, t in engine.calls)) and engine.calls[-1][1] is True, engine.calls


@needs_agent
async def test_stt_flush_finalizes_at_once_and_recognize_works(agent: Any) -> None:
    clip = librivox()[4]  # "he might even have been made amiable himself"
    pcm, _ = read_wav(clip.path, 16000)
    plugin = WhisperSTT(agent.asr_engine)
    stream = plugin.stream()
    for frame in room_frames(np.concatenate([quiet(0.3), pcm])):  # no trailing silence
        stream.push_frame(frame)
    stream.flush()  # LiveKit's turn detector says the turn is over
    final = None
    async for ev in stream:
        if ev.type == stt.SpeechEventType.FINAL_TRANSCRIPT:
            final = ev
            break
    assert final is not None and recall(final.alternatives[0].text, clip.text) >= 0.6
    await stream.aclose()
    whole = await plugin.recognize(buffer=room_frames(pcm))
    assert recall(whole.alternatives[0].text, clip.text) >= 0.6


@needs_agent
async def test_llm_plugin_streams_the_first_sentence_then_the_rest(agent: Any) -> None:
    plugin = DiffusionLLM(agent.responder)
    assert plugin.model == "voice-agent-bdlm"  # the embedded block diffusion LM
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="user", content="hello, how are you today?")
    chunks = [c async for c in plugin.chat(chat_ctx=ctx)]
    texts = [c.delta.content for c in chunks if c.delta and c.delta.content]
    expected = (await asyncio.to_thread(agent.responder.generate, "hello, how are you today?")).text.strip()
    assert "".join(texts) == expected  # the whole reply, as the responder decodes it unhurried
    assert first_sentence_ready(expected), expected  # two sentences: else nothing to stream
    # the first sentence goes to TTS while the rest is decoded, in one completion
    assert len(texts) == 2 and first_sentence_ready(texts[0]), texts
    assert len({c.id for c in chunks}) == 1


@needs_agent
async def test_tts_stream_speaks_the_first_sentence_before_the_rest_arrives(agent: Any) -> None:
    plugin = PiperStreamingTTS(agent.tts)
    assert plugin.capabilities.streaming and plugin.sample_rate == agent.tts.sample_rate
    stream = plugin.stream()
    stream.push_text("Hello there. ")
    stream.push_text("How are")
    it = stream.__aiter__()
    first = await asyncio.wait_for(it.__anext__(), 20)  # audio before the second sentence is complete
    stream.push_text(" you today?")
    stream.end_input()
    frames = [first.frame] + [ev.frame async for ev in it]
    pcm = np.concatenate([np.frombuffer(f.data, np.int16) for f in frames])
    assert all(f.sample_rate == agent.tts.sample_rate for f in frames)
    seconds = len(pcm) / agent.tts.sample_rate
    assert 1.0 < seconds < 6.0
    assert voiced_seconds(resample(pcm, agent.tts.sample_rate, 16000)) > 0.8
    heard = await asyncio.to_thread(agent.asr_engine.transcribe, resample(pcm, agent.tts.sample_rate, 16000) / 32768)
    assert recall(heard.text, "hello there how are you today") >= 0.6, heard.text
    await stream.aclose()


@needs_agent
@pytest.mark.slow
async def test_agent_session_answers_recorded_speech_without_a_room(agent: Any) -> None:
    first, second = librivox()[1], librivox()[4]
    a, _ = read_wav(first.path, 16000)
    b, _ = read_wav(second.path, 16000)
    call = np.concatenate([quiet(1.0), a, quiet(5.0), b, quiet(1.0)])
    result = await run_livekit_session(agent, call, keep_audio=True)
    assert not result["errors"], result["errors"]
    said = result["user_transcripts"]
    assert recall(" ".join(said), first.text) >= 0.6 and recall(" ".join(said), second.text) >= 0.6, said
    turns = result["turns"]
    assert len(turns) == 2, turns
    for turn, clip in zip(turns, (first, second), strict=True):
        assert recall(turn["user_text"], clip.text) >= 0.6, turn
        assert 0 < turn["gap_ms"] < 8000
        assert turn["agent_text"]
        # LiveKit committed the user turn (its message entered the chat) before answering it
        assert turn["committed_s"] is not None and turn["committed_s"] <= turn["agent_start_s"]
    assert turns[0]["agent_start_s"] < 1.0 + len(a) / 16000 + 5.0  # answered before the caller went on
    # the agent's audio is speech, and it starts where the turns say
    audio = result["agent_audio"]
    for turn in turns:
        i = int(turn["agent_start_s"] * 16000)
        assert voiced_seconds(audio[i : i + 16000 * 2]) > 0.2
        assert not np.abs(audio[max(0, i - 1600) : i - 160]).any()  # silent just before it
    assert result["agent_audio_s"] > 0.5


@needs_agent
async def test_plugins_for_an_agent_share_its_engines(agent: Any) -> None:
    stt_, llm_, tts_ = livekit_plugins_for(agent)
    assert stt_.engine is agent.asr_engine and llm_.responder is agent.responder and tts_.piper is agent.tts
    assert llm_.deadline_s == pytest.approx(agent.cfg.budgets.llm_block_ms * 4 / 1000)

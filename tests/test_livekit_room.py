"""The LiveKit room transport without a LiveKit server.

Audio goes through the real LiveKit client library: our output writes into an
``rtc.AudioSource``, a local track carries it, and an ``rtc.AudioStream`` reads it back, the
way a subscribed caller track is read in a room. Only the room itself (who joins, who leaves)
and the call session are faked, to test the caller policy of `RoomAgent`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import pytest
from livekit import rtc

from pipelines.events import EventBus, SessionEnd, SessionStart
from pipelines.transport import AudioOutput, RealtimeClock
from tests.speech import cards, librivox
from voice.audio import AudioFrame, read_wav, resample
from voice.transports.livekit_room import (
    EVENTS_TOPIC,
    SOURCE_QUEUE_MS,
    RoomAgent,
    RoomAudioInput,
    RoomAudioOutput,
    pcm_to_rtc,
)

pytestmark = pytest.mark.timeout(60)


def speech16(clip: Any) -> np.ndarray:
    pcm, _ = read_wav(clip.path, 16000)
    return pcm


async def collect(inp: RoomAudioInput, track: rtc.Track, frames: list[AudioFrame]) -> None:
    async def sink(f: AudioFrame) -> None:
        frames.append(f)

    await inp.pump(rtc.AudioStream(track, sample_rate=48000), sink)


def aligned_corr(got: np.ndarray, ref: np.ndarray) -> float:
    """Waveform correlation at the best alignment (the reader may start a frame late)."""
    probe = ref[len(ref) // 4 : len(ref) // 4 + 8000].astype(float)
    pos = int(np.argmax(np.correlate(got.astype(float), probe, "valid")))
    lag = pos - len(ref) // 4  # where ref[0] sits in got; negative: got missed the start
    a = got[max(lag, 0) :].astype(float)
    b = ref[max(-lag, 0) :].astype(float)
    n = min(len(a), len(b))
    return float(np.corrcoef(a[:n], b[:n])[0, 1])


async def test_output_is_an_audio_output() -> None:
    source = rtc.AudioSource(48000, 1)
    assert isinstance(RoomAudioOutput(source, RealtimeClock()), AudioOutput)
    await source.aclose()


async def test_speech_round_trip_48k_to_16k_through_livekit_tracks() -> None:
    clock = RealtimeClock()
    source = rtc.AudioSource(48000, 1, queue_size_ms=SOURCE_QUEUE_MS)
    track = rtc.LocalAudioTrack.create_audio_track("agent", source)
    out = RoomAudioOutput(source, clock, buffer_s=0.02)
    out.start()
    frames: list[AudioFrame] = []
    reader = asyncio.ensure_future(collect(RoomAudioInput(clock, 16000), track, frames))
    said = speech16(cards()[1])  # 2 s of recorded speech
    t = clock.now()
    starts = out.play(resample(said, 16000, 48000))
    assert starts == pytest.approx(t + 0.02, abs=0.01)
    assert out.busy_until() == pytest.approx(t + len(said) / 16000 + 0.02, abs=0.05)
    while out.busy_until() > clock.now():
        await asyncio.sleep(0.05)
    assert out.busy_until() <= clock.now()  # idle reads as not busy
    await asyncio.sleep(0.3)
    reader.cancel()
    await out.aclose()
    await source.aclose()
    assert {f.sample_rate for f in frames} == {16000}
    for a, b in zip(frames, frames[1:], strict=False):
        assert b.timestamp == pytest.approx(a.end, abs=1e-6)
    got = np.concatenate([f.pcm for f in frames])
    assert aligned_corr(got, said) > 0.97  # 16k -> 48k -> LiveKit -> 48k -> 16k keeps the waveform


async def test_interrupt_stops_the_track_and_counts_what_was_heard() -> None:
    clock = RealtimeClock()
    source = rtc.AudioSource(48000, 1, queue_size_ms=SOURCE_QUEUE_MS)
    track = rtc.LocalAudioTrack.create_audio_track("agent", source)
    out = RoomAudioOutput(source, clock)
    out.start()
    frames: list[AudioFrame] = []
    reader = asyncio.ensure_future(collect(RoomAudioInput(clock, 16000), track, frames))
    out.begin_turn(0)
    out.play(resample(speech16(librivox()[1]), 16000, 48000))  # 3 s
    await asyncio.sleep(0.8)
    heard = out.interrupt()
    t_cut = clock.now()
    assert 0.6 <= heard <= 1.0
    assert out.busy_until() <= t_cut + 0.05
    await asyncio.sleep(0.5)
    reader.cancel()
    await out.aclose()
    await source.aclose()
    loud_after = [f for f in frames if f.timestamp > t_cut + 0.25 and np.abs(f.pcm).max() > 500]
    assert not loud_after  # nothing more of the reply went out


def test_input_downmixes_and_resamples_stereo_frames() -> None:
    clock = RealtimeClock()
    inp = RoomAudioInput(clock, 16000)
    tone = (np.sin(np.arange(4800) * 2 * np.pi * 1000 / 48000) * 8000).astype(np.int16)
    stereo = np.stack([tone, tone], axis=1).reshape(-1)
    out = []
    for i in range(0, 4800, 480):  # 10 ms frames, as LiveKit delivers them
        f = inp.convert(rtc.AudioFrame(stereo[2 * i : 2 * (i + 480)].tobytes(), 48000, 2, 480))
        if f is not None:
            out.append(f)
    pcm = np.concatenate([f.pcm for f in out])
    assert 1400 <= len(pcm) <= 1600  # 0.1 s at 16 kHz, minus the resampler's tail
    spectrum = np.abs(np.fft.rfft(pcm[200:1400].astype(float)))
    assert abs(np.argmax(spectrum) * 16000 / 1200 - 1000) < 20


# RoomAgent's caller policy, with a fake room and a fake session


class FakeSession:
    def __init__(self, bus: EventBus, output: Any, clock: Any, transport: str) -> None:
        self.bus, self.output, self.clock, self.transport = bus, output, clock, transport
        self.session_id = f"s{id(self) % 10000}"
        self.frames: list[AudioFrame] = []
        self.hangup_requested = asyncio.Event()
        self.closed_reason: str | None = None

    async def start(self) -> None:
        self.bus.emit(SessionStart(self.session_id, self.clock.now(), transport=self.transport))

    async def push_audio(self, frame: AudioFrame) -> None:
        self.frames.append(frame)

    async def close(self, reason: str = "completed") -> dict[str, Any]:
        self.closed_reason = reason
        self.bus.emit(SessionEnd(self.session_id, self.clock.now(), reason=reason))
        return {"reason": reason}

    def loudness(self) -> float:
        pcm = np.concatenate([f.pcm for f in self.frames]) if self.frames else np.zeros(1)
        return float(np.sqrt((pcm.astype(float) ** 2).mean()))


class FakeAgent:
    def __init__(self) -> None:
        self.bus = EventBus()
        self.made: list[FakeSession] = []

    def new_session(self, output: Any, clock: Any, transport: str, session_id: str | None = None) -> FakeSession:
        s = FakeSession(self.bus, output, clock, transport)
        self.made.append(s)
        return s


class FakeLocalParticipant:
    def __init__(self) -> None:
        self.tracks: list[Any] = []
        self.data: list[tuple[str, dict[str, Any]]] = []

    async def publish_track(self, track: Any, options: Any) -> None:
        self.tracks.append(track)

    async def publish_data(self, payload: str, *, reliable: bool = True, topic: str = "") -> None:
        self.data.append((topic, json.loads(payload)))


class FakePublication:
    def __init__(self, track: Any) -> None:
        self.track = track


class FakeParticipant:
    def __init__(self, identity: str, track: Any, kind: int = rtc.ParticipantKind.PARTICIPANT_KIND_STANDARD) -> None:
        self.identity = identity
        self.kind = kind
        self.track_publications = {"TR_1": FakePublication(track)}


class FakeRoom:
    def __init__(self) -> None:
        self.local_participant = FakeLocalParticipant()
        self.remote_participants: dict[str, FakeParticipant] = {}
        self.handlers: dict[str, list[Any]] = {}

    def on(self, name: str, fn: Any) -> None:
        self.handlers.setdefault(name, []).append(fn)

    def join(self, p: FakeParticipant) -> None:
        self.remote_participants[p.identity] = p
        track = p.track_publications["TR_1"].track
        for fn in self.handlers.get("track_subscribed", []):
            fn(track, p.track_publications["TR_1"], p)

    def leave(self, identity: str) -> None:
        p = self.remote_participants.pop(identity)
        for fn in self.handlers.get("participant_disconnected", []):
            fn(p)


class Microphone:
    """A real LiveKit local track fed with recorded speech (or silence) in real time."""

    live: list[Microphone] = []

    def __init__(self, pcm16: np.ndarray | None) -> None:
        Microphone.live.append(self)
        self.source = rtc.AudioSource(48000, 1, queue_size_ms=SOURCE_QUEUE_MS)
        self.track = rtc.LocalAudioTrack.create_audio_track("mic", self.source)
        self.pcm = resample(pcm16, 16000, 48000) if pcm16 is not None else np.zeros(48000 * 20, np.int16)
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        for i in range(0, len(self.pcm), 960):
            chunk = self.pcm[i : i + 960]
            await self.source.capture_frame(pcm_to_rtc(np.pad(chunk, (0, 960 - len(chunk))), 48000))


async def wait_until(cond: Any, within: float) -> None:
    end = time.monotonic() + within
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.fixture
async def room() -> Any:
    yield FakeRoom()
    for mic in Microphone.live:  # stop feeding LiveKit before this test's event loop goes away
        mic.task.cancel()
        await mic.source.aclose()
    Microphone.live.clear()
    await asyncio.sleep(0.05)


async def test_first_caller_is_taken_and_survives_a_quick_rejoin(room: FakeRoom) -> None:
    agent = FakeAgent()
    ra = RoomAgent(room, agent, rejoin_grace_s=0.6)
    await ra.start()
    assert room.local_participant.tracks == [ra.track]
    alice = Microphone(speech16(librivox()[3]))
    bob = Microphone(None)
    room.join(FakeParticipant("bot", Microphone(None).track, kind=rtc.ParticipantKind.PARTICIPANT_KIND_AGENT))
    room.join(FakeParticipant("alice", alice.track))
    room.join(FakeParticipant("bob", bob.track))
    assert ra.caller == "alice" and len(agent.made) == 1
    session = agent.made[0]
    assert session.transport == "livekit"
    await wait_until(lambda: session.loudness() > 300, 5)  # alice's speech, not bob's silence
    assert all(f.sample_rate == 16000 for f in session.frames)
    await wait_until(
        lambda: any(t == EVENTS_TOPIC and d["type"] == "session/start" for t, d in room.local_participant.data), 2
    )

    room.leave("alice")  # a network blip: she is back within the grace period
    await asyncio.sleep(0.2)
    room.join(FakeParticipant("alice", alice.track))
    await asyncio.sleep(0.8)
    assert session.closed_reason is None and ra.session is session and len(agent.made) == 1
    n = len(session.frames)
    await asyncio.sleep(0.3)
    assert len(session.frames) > n  # her audio flows into the same session again
    await ra.aclose()
    assert session.closed_reason == "room_closed"


async def test_caller_who_leaves_for_good_hands_over_to_the_next(room: FakeRoom) -> None:
    agent = FakeAgent()
    ra = RoomAgent(room, agent, rejoin_grace_s=0.3)
    await ra.start()
    room.join(FakeParticipant("alice", Microphone(None).track))
    room.join(FakeParticipant("bob", Microphone(speech16(librivox()[3])).track))
    first = agent.made[0]
    room.leave("alice")
    await wait_until(lambda: first.closed_reason is not None, 3)
    assert first.closed_reason == "participant_left"
    await wait_until(lambda: ra.caller == "bob", 2)
    second = agent.made[1]
    await wait_until(lambda: second.loudness() > 300, 5)
    second.hangup_requested.set()  # an operator hangs up (MQTT control)
    await wait_until(lambda: second.closed_reason == "hangup_requested", 3)
    assert ra.session is None
    await ra.aclose()


async def test_configured_participant_is_the_only_caller(room: FakeRoom) -> None:
    agent = FakeAgent()
    ra = RoomAgent(room, agent, participant="bob")
    await ra.start()
    room.join(FakeParticipant("alice", Microphone(None).track))
    assert ra.caller is None and not agent.made
    room.join(FakeParticipant("bob", Microphone(None).track))
    assert ra.caller == "bob" and len(agent.made) == 1
    await ra.aclose()


async def test_caller_already_in_the_room_is_picked_up_at_start(room: FakeRoom) -> None:
    agent = FakeAgent()
    room.remote_participants["carol"] = FakeParticipant("carol", Microphone(None).track)
    ra = RoomAgent(room, agent)
    await ra.start()
    assert ra.caller == "carol"
    await ra.aclose()

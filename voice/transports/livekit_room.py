"""A LiveKit room as a transport: the caller's track in, the agent's track out.

    caller track --rtc.AudioStream 48k--> RoomAudioInput --16k AudioFrame--> CallSession
    CallSession --pcm 48k--> RoomAudioOutput --rtc.AudioSource--> agent track --> room

`RoomAgent` runs our own pipeline (the same `CallSession` as every other transport) for one
caller at a time: the participant named in ``livekit.participant``, else the first one that
publishes audio. A caller who leaves has ``rejoin_grace_s`` to come back (a reconnect) and
carry on the same session; after that the session ends and the next participant with audio,
if any, becomes the caller. The session's events go to the room as data packets on the topic
``voice-agent.events``, the way the WebRTC page gets them over its data channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import numpy as np
from livekit import rtc

from voice.audio import AudioFrame, StreamResampler
from voice.events import Event, to_json
from voice.transports.base import Clock, RealtimeClock

log = logging.getLogger(__name__)

LIVEKIT_RATE = 48000
FRAME_MS = 20
# Audio handed to LiveKit ahead of playout. It rides out event-loop stalls (measured: a 100 ms
# queue broke up the agent's voice under 150 ms stalls, 400 ms did not); interrupts clear it.
SOURCE_QUEUE_MS = 400
EVENTS_TOPIC = "voice-agent.events"


def rtc_to_pcm(frame: rtc.AudioFrame) -> np.ndarray:
    """int16 mono samples of an ``rtc.AudioFrame`` (interleaved channels are averaged)."""
    pcm = np.frombuffer(frame.data, dtype=np.int16)
    if frame.num_channels > 1:
        pcm = pcm.reshape(-1, frame.num_channels).astype(np.float32).mean(axis=1).astype(np.int16)
    return pcm


def pcm_to_rtc(pcm: np.ndarray, sample_rate: int) -> rtc.AudioFrame:
    pcm = np.ascontiguousarray(pcm, dtype=np.int16)
    return rtc.AudioFrame(pcm.tobytes(), sample_rate, 1, len(pcm))


class RoomAudioInput:
    """``rtc.AudioFrame``s (any rate, any channels) -> our `AudioFrame`s at the ASR rate.

    Converted once, with one stateful resampler; time is the sample count since the first
    frame, which is placed on the call timeline where it arrived. LiveKit's own jitter
    buffer hands out a continuous stream, so counting samples keeps the timeline exact.
    """

    def __init__(self, clock: Clock, target_rate: int = 16000) -> None:
        self.clock = clock
        self.target_rate = target_rate
        self._rs: StreamResampler | None = None
        self._t0 = 0.0
        self._out = 0

    def convert(self, frame: rtc.AudioFrame) -> AudioFrame | None:
        pcm = rtc_to_pcm(frame)
        if self._rs is None or self._rs.src_rate != frame.sample_rate:
            self._t0 = (
                self._t0 + self._out / self.target_rate
                if self._rs is not None
                else max(0.0, self.clock.now() - len(pcm) / frame.sample_rate)
            )
            self._out = 0
            self._rs = StreamResampler(frame.sample_rate, self.target_rate)
        out = self._rs.process(pcm)
        if len(out) == 0:
            return None
        result = AudioFrame(out, self.target_rate, self._t0 + self._out / self.target_rate)
        self._out += len(out)
        return result

    async def pump(self, frames: AsyncIterable[Any], sink: Callable[[AudioFrame], Awaitable[None]]) -> None:
        """Feed ``sink`` until the stream ends; items are ``rtc.AudioFrameEvent`` or frames."""
        async for item in frames:
            frame = getattr(item, "frame", item)
            out = self.convert(frame)
            if out is not None:
                await sink(out)


class RoomAudioOutput:
    """The session's `AudioOutput`, writing 20 ms frames into an ``rtc.AudioSource``.

    `play` only queues. A pump task hands frames to the source, whose own small queue
    (``queue_size_ms``) paces it to real time, so we always know how much was handed over
    and how much of that has played: what `interrupt` and `busy_until` report.
    """

    def __init__(self, source: rtc.AudioSource, clock: Clock, buffer_s: float = 0.02) -> None:
        self.source = source
        self.sample_rate = source.sample_rate
        self._clock = clock
        self._buffer_s = buffer_s
        self._frame = self.sample_rate * FRAME_MS // 1000
        self._queue: deque[np.ndarray] = deque()
        self._queued = 0
        self._wake = asyncio.Event()
        self._handed_until = 0.0  # monotonic time when all handed-over audio has played
        self._turn_handed = 0
        self._played_until = 0.0  # call time the last audio reached the caller
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._pump())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _in_source(self) -> float:
        return max(0.0, self._handed_until - time.monotonic())

    # AudioOutput
    def begin_turn(self, turn: int) -> None:
        self._turn_handed = 0

    def play(self, pcm: np.ndarray) -> float:
        pcm = np.asarray(pcm)
        if pcm.ndim != 1:
            raise ValueError("RoomAudioOutput.play takes 1-D mono PCM")
        starts = self._clock.now() + self._queued / self.sample_rate + self._in_source() + self._buffer_s
        if len(pcm):
            self._queue.append(pcm.astype(np.int16, copy=False))
            self._queued += len(pcm)
            self._wake.set()
        return starts

    def interrupt(self) -> float:
        heard = max(0.0, self._turn_handed / self.sample_rate - self._in_source())
        if self._queued or self._in_source():
            self._played_until = self._clock.now() + self._buffer_s
        self._queue.clear()
        self._queued = 0
        self.source.clear_queue()
        self._handed_until = time.monotonic()
        return heard

    def busy_until(self) -> float:
        ahead = self._queued / self.sample_rate + self._in_source()
        if ahead > 0:
            return self._clock.now() + ahead + self._buffer_s
        return self._played_until  # idle: never "now", which would read as still busy

    async def _pump(self) -> None:
        while True:
            if not self._queued:
                self._wake.clear()
                await self._wake.wait()
                continue
            n = min(self._frame, self._queued)
            chunk = np.concatenate(self._take(n))
            now = time.monotonic()
            self._handed_until = max(now, self._handed_until) + len(chunk) / self.sample_rate
            self._turn_handed += len(chunk)
            self._played_until = self._clock.now() + self._in_source() + self._buffer_s
            await self.source.capture_frame(pcm_to_rtc(chunk, self.sample_rate))

    def _take(self, n: int) -> list[np.ndarray]:
        out = []
        while n > 0 and self._queue:
            head = self._queue[0]
            if len(head) <= n:
                out.append(self._queue.popleft())
                n -= len(head)
                self._queued -= len(head)
            else:
                out.append(head[:n])
                self._queue[0] = head[n:]
                self._queued -= n
                n = 0
        return out


class RoomAgent:
    """Our pipeline in a room: one caller at a time, the agent's voice on one track."""

    def __init__(
        self,
        room: Any,
        agent: Any,
        *,
        participant: str | None = None,
        asr_rate: int = 16000,
        buffer_s: float = 0.02,
        rejoin_grace_s: float = 10.0,
        stream_factory: Callable[[Any], AsyncIterable[Any]] | None = None,
    ) -> None:
        self.room = room
        self.agent = agent
        self.wanted = participant
        self.asr_rate = asr_rate
        self.buffer_s = buffer_s
        self.rejoin_grace_s = rejoin_grace_s
        self._stream_factory = stream_factory or (lambda track: rtc.AudioStream(track, sample_rate=LIVEKIT_RATE))
        self.source = rtc.AudioSource(LIVEKIT_RATE, 1, queue_size_ms=SOURCE_QUEUE_MS)
        self.track = rtc.LocalAudioTrack.create_audio_track("agent-voice", self.source)
        self.caller: str | None = None  # identity of the participant we talk to
        self.session: Any = None
        self.output: RoomAudioOutput | None = None
        self.reports: list[dict[str, Any]] = []
        self.closed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._grace: asyncio.Task[None] | None = None
        self._events: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # lifecycle
    async def start(self) -> None:
        options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
        await self.room.local_participant.publish_track(self.track, options)
        self.room.on("track_subscribed", self._on_track_subscribed)
        self.room.on("participant_disconnected", self._on_participant_disconnected)
        self.room.on("reconnecting", lambda *_: log.info("room connection lost; LiveKit is reconnecting"))
        self.room.on("reconnected", lambda *_: log.info("room connection back"))
        self.room.on("disconnected", lambda *_: self._spawn(self.aclose()))
        self._pick_existing()

    async def aclose(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        await self._end_session("room_closed")
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        await self.source.aclose()

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # caller selection
    def _eligible(self, participant: Any) -> bool:
        if getattr(participant, "kind", None) == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
            return False  # another agent (or ourselves on a second job)
        return self.wanted is None or participant.identity == self.wanted

    def _audio_track(self, participant: Any) -> Any:
        for pub in participant.track_publications.values():
            track = getattr(pub, "track", None)
            if track is not None and getattr(track, "kind", None) == rtc.TrackKind.KIND_AUDIO:
                return track
        return None

    def _pick_existing(self) -> None:
        if self.caller is not None:
            return
        for participant in self.room.remote_participants.values():
            track = self._audio_track(participant)
            if track is not None and self._eligible(participant):
                self._attach(participant, track)
                return

    def _on_track_subscribed(self, track: Any, publication: Any, participant: Any) -> None:
        if getattr(track, "kind", None) != rtc.TrackKind.KIND_AUDIO or not self._eligible(participant):
            return
        if self.caller is None or participant.identity == self.caller:
            self._attach(participant, track)  # a new caller, or ours coming back

    def _on_participant_disconnected(self, participant: Any) -> None:
        if participant.identity != self.caller:
            return
        log.info("caller %s left; waiting %.0f s for a reconnect", participant.identity, self.rejoin_grace_s)
        if self._reader is not None:
            self._reader.cancel()
        self._grace = self._spawn(self._wait_for_rejoin())

    async def _wait_for_rejoin(self) -> None:
        await asyncio.sleep(self.rejoin_grace_s)
        await self._end_session("participant_left")
        self._pick_existing()

    # the call
    def _attach(self, participant: Any, track: Any) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if self.session is None:
            self._new_session(participant.identity)
        elif self._reader is not None:
            self._reader.cancel()
        assert self.session is not None
        # a fresh converter places a rejoined caller's audio where it arrives on the timeline
        converter = RoomAudioInput(self.session.clock, self.asr_rate)
        self._reader = self._spawn(self._read(track, converter))
        log.info("talking to %s", participant.identity)

    def _new_session(self, identity: str) -> None:
        clock = RealtimeClock()
        self.output = RoomAudioOutput(self.source, clock, self.buffer_s)
        self.output.start()
        self.session = self.agent.new_session(self.output, clock, transport="livekit")
        self.caller = identity
        events, _ = self.agent.bus.subscribe(maxsize=2000)  # before start(): SessionStart included
        self._events = self._spawn(self._forward_events(self.session, events))
        self._spawn(self.session.start())
        self._spawn(self._watch_hangup(self.session))

    async def _read(self, track: Any, converter: RoomAudioInput) -> None:
        session = self.session
        stream = self._stream_factory(track)
        try:
            await converter.pump(stream, session.push_audio)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("caller audio stream failed")
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(closer())

    async def _watch_hangup(self, session: Any) -> None:
        await session.hangup_requested.wait()
        if session is self.session:
            await self._end_session("hangup_requested")
            self._pick_existing()

    async def _forward_events(self, session: Any, queue: asyncio.Queue[Event]) -> None:
        try:
            while True:
                event: Event = await queue.get()
                if event.session_id != session.session_id:
                    continue
                payload = to_json(event.to_dict())
                try:
                    await self.room.local_participant.publish_data(payload, reliable=True, topic=EVENTS_TOPIC)
                except Exception as exc:  # a full or closed data channel must not stop the call
                    log.debug("event not published: %r", exc)
        finally:
            self.agent.bus.unsubscribe(queue)

    async def _end_session(self, reason: str) -> None:
        session, self.session = self.session, None
        caller, self.caller = self.caller, None
        for task in (self._reader, self._grace):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._reader = self._grace = None
        if session is None:
            return
        try:
            self.reports.append(await session.close(reason))
        except Exception:
            log.exception("closing the session with %s failed", caller)
        if self._events is not None:
            await asyncio.sleep(0.05)  # let SessionEnd reach the room
            self._events.cancel()
            self._events = None
        if self.output is not None:
            self.output.interrupt()
            await self.output.aclose()
            self.output = None
        log.info("session with %s ended: %s", caller, reason)


"""Direct browser calls over WebRTC (aiortc): one peer connection per call session.

    browser mic --Opus 48k--> CallerAudioReader --16k AudioFrame--> CallSession
    CallSession --pcm 48k--> AgentAudioTrack --20 ms frames, Opus--> browser speaker
    agent.bus (this session's events) --JSON--> data channel "events" --> page

The caller's audio is converted once: downmixed and resampled 48 kHz -> 16 kHz (the ASR rate)
with a stateful resampler, and stamped on the call timeline from the RTP timestamps, so a
lost packet or a late burst does not shift later audio. The agent's audio goes out at 48 kHz,
paced on the wall clock one 20 ms frame at a time, with silence when the agent is quiet
(WebRTC wants a continuous stream; the browser's jitter buffer would otherwise stall).
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpsender import RTCRtpSender
from aiortc.sdp import SessionDescription

from voice.audio import AudioFrame, StreamResampler
from voice.events import Event, to_json
from voice.transports.base import Clock, RealtimeClock

log = logging.getLogger(__name__)

WEBRTC_RATE = 48000  # Opus always runs at 48 kHz on the wire
FRAME_MS = 20


def first_line(exc: BaseException) -> str:
    """A one-line, bounded description of an exception for an HTTP error body."""
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


class OfferError(ValueError):
    """The browser's offer cannot be answered. ``status`` is the HTTP status to send back."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_offer(sdp: object, kind: object) -> str:
    """Validate an offer before aiortc sees it; returns the SDP. Raises OfferError (4xx)."""
    if kind != "offer":
        raise OfferError(f'"type" must be "offer", got {kind!r}')
    if not isinstance(sdp, str) or not sdp.strip():
        raise OfferError('"sdp" must be a non-empty string')
    if not sdp.lstrip().startswith("v=0"):
        raise OfferError("not an SDP offer (it must start with v=0)")
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser raises assorted types on malformed lines
        raise OfferError(f"malformed SDP: {first_line(exc)}") from None
    audio = [m for m in desc.media if m.kind == "audio"]
    if not audio:
        raise OfferError("the offer has no audio section; this server answers audio calls only")
    codecs = {c.mimeType.split("/", 1)[-1] for m in audio for c in m.rtp.codecs}
    if "opus" not in {c.lower() for c in codecs}:
        offered = ", ".join(sorted(codecs)) or "none"
        raise OfferError(f"the offer's audio codecs ({offered}) do not include Opus/48000, the only codec served", 415)
    return sdp


def loopback_only_ice(host: str) -> bool:
    """Gather ICE host candidates on ``host`` only, when it is a single loopback address.

    aioice always skips 127.0.0.1 and offers every other interface, and aiortc has no
    option to choose interfaces. A server bound to loopback must not leak the machine's
    other addresses to the browser or send media over them, so we replace aioice's address
    lookup for this process. Returns whether it did.
    """
    import ipaddress

    import aioice.ice

    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if not addr.is_loopback:
        return False

    def _only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [host] if (addr.version == 4 and use_ipv4) or (addr.version == 6 and use_ipv6) else []

    aioice.ice.get_host_addresses = _only
    return True


def keep_loopback_candidates(sdp: str) -> str:
    """Drop the offer's non-loopback ICE candidates, so media can only flow over loopback."""
    import ipaddress

    def _keep(line: str) -> bool:
        if not line.startswith("a=candidate:"):
            return True
        fields = line.split()
        try:
            return len(fields) > 4 and ipaddress.ip_address(fields[4]).is_loopback
        except ValueError:  # an mDNS name such as abcd.local
            return False

    eol = "\r\n" if "\r\n" in sdp else "\n"
    return eol.join(line for line in sdp.split(eol) if _keep(line))


class AgentAudioTrack(MediaStreamTrack):
    """The agent's voice as an outgoing WebRTC track, and the session's `AudioOutput`.

    `play` only queues; `recv` (called by aiortc's sender) hands out one 20 ms frame at a
    time on an absolute wall-clock schedule, silence when nothing is queued.
    """

    kind = "audio"

    def __init__(self, clock: Clock, sample_rate: int = WEBRTC_RATE, buffer_s: float = 0.02) -> None:
        super().__init__()
        self.sample_rate = sample_rate
        self._clock = clock
        self._buffer_s = buffer_s  # playout delay after a frame leaves us (encode, network, jitter buffer)
        self._frame = sample_rate * FRAME_MS // 1000
        self._queue: deque[np.ndarray] = deque()
        self._queued = 0
        self._turn_sent = 0
        self._played_until = 0.0
        self._start: float | None = None
        self._pts = 0
        self.frames_sent = 0
        self.voiced_frames_sent = 0

    # AudioOutput
    def begin_turn(self, turn: int) -> None:
        self._turn_sent = 0

    def play(self, pcm: np.ndarray) -> float:
        pcm = np.asarray(pcm)
        if pcm.ndim != 1:
            raise ValueError("AgentAudioTrack.play takes 1-D mono PCM")
        starts = self._clock.now() + self._queued / self.sample_rate + self._buffer_s
        if len(pcm):
            self._queue.append(pcm.astype(np.int16, copy=False))
            self._queued += len(pcm)
        return starts

    def interrupt(self) -> float:
        if self._queued:
            self._played_until = self._clock.now() + self._buffer_s  # what is in flight still plays
        self._queue.clear()
        self._queued = 0
        return self._turn_sent / self.sample_rate

    def busy_until(self) -> float:
        if self._queued:
            return self._clock.now() + self._queued / self.sample_rate + self._buffer_s
        # idle: when the last sample reached the caller, never "now" (which would read as busy
        # to a caller comparing it with a clock reading taken a moment earlier)
        return self._played_until

    # MediaStreamTrack
    def _pull(self, n: int) -> tuple[np.ndarray, bool]:
        out = np.zeros(n, dtype=np.int16)
        filled = 0
        while filled < n and self._queue:
            head = self._queue[0]
            take = min(n - filled, len(head))
            out[filled : filled + take] = head[:take]
            filled += take
            if take == len(head):
                self._queue.popleft()
            else:
                self._queue[0] = head[take:]
        self._queued -= filled
        self._turn_sent += filled
        if filled and not self._queued:
            self._played_until = self._clock.now() + filled / self.sample_rate + self._buffer_s
        return out, filled > 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._pts += self._frame
            wait = self._start + self._pts / self.sample_rate - now
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -0.5:
                # the loop stalled: skip ahead instead of bursting half a second of frames
                self._start = now - self._pts / self.sample_rate
        pcm, voiced = self._pull(self._frame)
        self.frames_sent += 1
        self.voiced_frames_sent += int(voiced)
        frame = av.AudioFrame(format="s16", layout="mono", samples=self._frame)
        frame.planes[0].update(pcm.tobytes())
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, self.sample_rate)
        return frame


def av_frame_to_mono(frame: av.AudioFrame) -> np.ndarray:
    """Decoded WebRTC audio (s16 or fltp, mono or stereo, packed or planar) as int16 mono."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        chans = data.reshape(channels, -1)
    else:
        chans = data.reshape(-1, channels).T
    if chans.dtype != np.int16:  # float formats
        chans = np.clip(chans.astype(np.float32), -1.0, 1.0) * 32767.0
    mono = chans.astype(np.float32).mean(axis=0) if channels > 1 else chans[0]
    return np.asarray(mono).astype(np.int16)


class CallerAudioConverter:
    """48 kHz decoded frames -> `AudioFrame`s at the ASR rate on the call timeline.

    Time comes from the RTP timestamps (``pts`` in samples): the first frame is placed at
    the call time it arrived, later ones at their RTP offset from it. Missing audio (lost
    packets, a stalled sender) is filled with silence so the session sees a continuous stream.
    """

    MAX_GAP_S = 2.0

    def __init__(self, clock: Clock, target_rate: int = 16000) -> None:
        self._clock = clock
        self.target_rate = target_rate
        self._rs: StreamResampler | None = None
        self._src_rate = 0
        self._next_pts: int | None = None
        self._t0 = 0.0
        self._out_samples = 0

    def convert(self, pcm: np.ndarray, sample_rate: int, pts: int | None) -> AudioFrame | None:
        if self._rs is None or sample_rate != self._src_rate:
            if self._rs is not None:
                self._t0 = self._t0 + self._out_samples / self.target_rate
                self._out_samples = 0
            else:
                self._t0 = max(0.0, self._clock.now() - len(pcm) / sample_rate)
            self._rs = StreamResampler(sample_rate, self.target_rate)
            self._src_rate = sample_rate
            self._next_pts = None
        if pts is not None:
            gap = 0 if self._next_pts is None else pts - self._next_pts
            self._next_pts = pts + len(pcm)
            # a gap is lost audio; a jump backwards or a huge leap is a new RTP timeline: go on
            if 0 < gap <= self.MAX_GAP_S * sample_rate:
                pcm = np.concatenate([np.zeros(gap, dtype=np.int16), pcm])
        out = self._rs.process(pcm)
        if len(out) == 0:
            return None
        frame = AudioFrame(
            out.astype(np.int16, copy=False), self.target_rate, self._t0 + self._out_samples / self.target_rate
        )
        self._out_samples += len(out)
        return frame


async def read_caller_audio(
    track: MediaStreamTrack,
    sink: Callable[[AudioFrame], Awaitable[None]],
    converter: CallerAudioConverter,
    idle_timeout_s: float = 5.0,
) -> str:
    """Pump the caller's track into ``sink`` until it ends; returns why it ended.

    A browser keeps sending (silence when muted), so no audio for ``idle_timeout_s`` means the
    peer is gone; that is much sooner than ICE consent expiry (30 s).
    """
    while True:
        try:
            frame = await asyncio.wait_for(track.recv(), idle_timeout_s)
        except TimeoutError:
            return "peer_gone"
        except MediaStreamError:
            return "track_ended"
        pcm = av_frame_to_mono(frame)
        out = converter.convert(pcm, frame.sample_rate, frame.pts)
        if out is not None:
            await sink(out)


def event_json(event: Event) -> str:
    return to_json(event.to_dict())


class WebrtcCall:
    """One browser call: the peer connection, its call session, and the event channel.

    ``close`` is idempotent and safe from any task; it ends the session (which emits
    SessionEnd and returns the report) and closes the peer connection.
    """

    def __init__(
        self, agent: Any, *, asr_rate: int = 16000, buffer_s: float = 0.02, idle_timeout_s: float = 5.0,
        seat: Any = None,
    ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.agent = agent
        self.clock = RealtimeClock()
        self.output = AgentAudioTrack(self.clock, buffer_s=buffer_s)
        self.converter = CallerAudioConverter(self.clock, asr_rate)
        self.idle_timeout_s = idle_timeout_s
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # loopback / LAN: no STUN lookups
        self.seat = seat  # the agent's admission of this call (has .release()); the server gives it back
        admitted = {"seat": seat} if seat is not None else {}
        self.session = agent.new_session(self.output, self.clock, transport="webrtc", session_id=self.id, **admitted)
        self.client_gaps_ms: list[float] = []
        self.report: dict[str, Any] | None = None
        self.end_reason: str | None = None
        self.closed = asyncio.Event()
        self._channel: Any = None
        self._pending: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing: asyncio.Task[dict[str, Any] | None] | None = None
        self._events, _ = agent.bus.subscribe(maxsize=2000)

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"webrtc-{self.id}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def answer(self, sdp: str) -> str:
        """Answer a checked offer (see `check_offer`); returns the answer SDP."""
        pc = self.pc

        @pc.on("track")
        def _on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                self._spawn(self._read(track), "read")

        @pc.on("datachannel")
        def _on_channel(channel: Any) -> None:
            self._attach_channel(channel)

        @pc.on("connectionstatechange")
        async def _on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                self._spawn(self.close("peer_gone" if pc.connectionState == "failed" else "hangup"), "close")

        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        audio = [t for t in pc.getTransceivers() if t.kind == "audio"]
        if not audio:
            raise OfferError("the offer has no usable audio section")
        audio[0].direction = "sendrecv"
        pc.addTrack(self.output)
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
        audio[0].setCodecPreferences(opus)
        answer = await pc.createAnswer()
        await pc.setLocalDescription(answer)  # aiortc gathers all candidates here: no trickle
        await self.session.start()
        self._spawn(self._forward_events(), "events")
        self._spawn(self._watch_hangup(), "hangup")
        return pc.localDescription.sdp

    async def _read(self, track: MediaStreamTrack) -> None:
        reason = await read_caller_audio(track, self.session.push_audio, self.converter, self.idle_timeout_s)
        await self.close(reason)

    async def _watch_hangup(self) -> None:
        await self.session.hangup_requested.wait()
        self.send({"type": "hangup", "reason": "agent"})
        await self.close("hangup_requested")

    # data channel
    def _attach_channel(self, channel: Any) -> None:
        self._channel = channel

        @channel.on("open")
        def _on_open() -> None:
            self._flush()

        @channel.on("message")
        def _on_message(message: Any) -> None:
            self._on_client_message(message)

        @channel.on("close")
        def _on_close() -> None:
            self._channel = None

        self._flush()

    def send(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else to_json(payload)
        self._pending.append(text)
        self._flush()

    def _flush(self) -> None:
        ch = self._channel
        if ch is None or ch.readyState != "open":
            if len(self._pending) > 500:
                del self._pending[:-500]  # nobody is listening yet; keep the newest
            return
        while self._pending:
            try:
                ch.send(self._pending[0])
            except Exception:  # the channel closed under us: the call is ending anyway
                return
            self._pending.pop(0)

    def _on_client_message(self, message: Any) -> None:
        try:
            msg = json.loads(message) if isinstance(message, str) else None
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            self.send({"type": "error", "message": "data channel messages must be JSON objects"})
            return
        kind = msg.get("type")
        if kind == "hangup":
            self._spawn(self.close("hangup"), "close")
        elif kind == "client_gap":
            gap = msg.get("gap_ms")
            if isinstance(gap, int | float):
                self.client_gaps_ms.append(float(gap))
                log.info("session %s: browser-measured turn gap %.0f ms", self.id, gap)
        elif kind == "ping":
            self.send({"type": "pong", "t": self.clock.now(), "client_t": msg.get("t")})
        else:
            self.send({"type": "error", "message": f"unknown message type {kind!r}"})

    async def _forward_events(self) -> None:
        while True:
            event = await self._events.get()
            if event.session_id == self.id:
                self.send(event_json(event))

    # teardown
    async def close(self, reason: str = "hangup") -> dict[str, Any] | None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(reason))
        return await asyncio.shield(self._closing)

    async def _close(self, reason: str) -> dict[str, Any] | None:
        self.end_reason = reason
        try:
            self.report = await self.session.close(reason)
        except Exception:
            log.exception("session %s: close failed", self.id)
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        # deliver what is left (SessionEnd at least) before the channel goes away
        while not self._events.empty():
            event = self._events.get_nowait()
            if event.session_id == self.id:
                self.send(event_json(event))
        self.agent.bus.unsubscribe(self._events)
        if self._channel is not None and self._channel.readyState == "open":
            await asyncio.sleep(0.1)  # SCTP sends asynchronously
        self.output.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()
        self.closed.set()
        log.info("session %s ended: %s", self.id, reason)
        return self.report

"""One call's RTP: the UDP port, the receive path into the session, and the paced sender.

Receive path: datagram -> allowlist -> RTP parse -> (telephone-event -> DTMF | G.711 ->
jitter buffer). A playout task pops one 20 ms frame per tick and pushes it, still at 8 kHz,
into the session, which resamples once to the ASR rate. Frames are stamped on the call
timeline from the arrival of the first packet, one frame per 20 ms, so the timeline stays
continuous through loss and silence.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from voice.audio import AudioFrame
from voice.transports.base import Clock

from .dtmf import DtmfDigit, DtmfError, DtmfReceiver
from .jitter import JitterBuffer
from .output import FRAME, RATE, RtpAudioOutput
from .rtp import RtpError, RtpPacket
from .sdp import MediaPlan
from .sender import PACER, PTIME_S, RtpSender

log = logging.getLogger("voice.sip.media")
COMFORT_NOISE_PT = 13


class AudioSink(Protocol):
    async def push_audio(self, frame: AudioFrame) -> None: ...

    def push_dtmf(self, digit: str, duration_ms: int = 0) -> None: ...


@dataclass
class ReceiveStats:
    packets: int = 0
    rejected_source: int = 0
    malformed: int = 0
    unknown_payload: int = 0
    before_answer: int = 0
    dtmf_packets: int = 0
    comfort_noise: int = 0
    other_stream: int = 0  # valid RTP from a second source while the caller's is live
    errors: int = 0  # bugs caught in the receive path (must stay 0)


@dataclass
class Bound:
    sock: socket.socket
    transport: asyncio.BaseTransport
    rtcp: asyncio.BaseTransport
    port: int


class PortPool:
    """Even RTP ports from a range; the odd port above each is bound as an RTCP sink."""

    def __init__(self, low: int, high: int) -> None:
        self.low = low + (low % 2)
        self.high = high
        self._next = self.low
        self.in_use: set[int] = set()

    async def bind(self, ip: str, protocol: Callable[[], asyncio.DatagramProtocol]) -> Bound:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        span = max(1, (self.high - self.low) // 2 + 1)
        for _ in range(span):
            port = self._next
            self._next = self.low if self._next + 2 > self.high else self._next + 2
            if port in self.in_use:
                continue
            rtp = socket.socket(family, socket.SOCK_DGRAM)
            rtcp = socket.socket(family, socket.SOCK_DGRAM)
            try:
                rtp.bind((ip, port))
                # RTCP is not used, but an unbound port would answer the peer's reports with ICMP errors.
                rtcp.bind((ip, port + 1))
            except OSError:
                rtp.close()
                rtcp.close()
                continue
            rtp.setblocking(False)
            rtcp.setblocking(False)
            # The socket stays ours: the pacer thread sends on it directly, asyncio only receives.
            transport, _ = await loop.create_datagram_endpoint(protocol, sock=rtp)
            rtcp_transport, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, sock=rtcp)
            self.in_use.add(port)
            return Bound(rtp, transport, rtcp_transport, port)
        raise OSError(f"no free RTP port in {self.low}-{self.high}")

    def release(self, port: int) -> None:
        self.in_use.discard(port)


class RtpReceiver(asyncio.DatagramProtocol):
    LATCH_HOLD_S = 0.5

    def __init__(
        self, allowed: Callable[[str], bool], clock: Clock, jitter_ms: int, jitter_min_ms: int | None = None
    ) -> None:
        self.allowed = allowed
        self.clock = clock
        self.plan: MediaPlan | None = None
        self.jitter = JitterBuffer(FRAME, target_ms=jitter_ms, rate=RATE, min_ms=jitter_min_ms)
        self.dtmf = DtmfReceiver(RATE)
        self.stats = ReceiveStats()
        self.digits: list[DtmfDigit] = []
        self.on_digit: Callable[[DtmfDigit], None] | None = None
        self.first_audio_at: float | None = None  # call time of the first caller packet
        self.source: tuple[Any, ...] | None = None  # the (ip, port) the caller's RTP comes from
        self.last_packet = time.monotonic()

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        try:
            self._receive(data, addr)
        except Exception:
            self.stats.errors += 1  # one bad packet must not end the call; tests require this to stay 0
            if self.stats.errors == 1:
                log.exception("RTP receive failed")

    def _receive(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if not self.allowed(addr[0]):
            self.stats.rejected_source += 1
            return
        try:
            packet = RtpPacket.parse(data)
        except RtpError:
            self.stats.malformed += 1
            return
        plan = self.plan
        if plan is None:
            self.stats.before_answer += 1
            return
        now = time.monotonic()
        if self.source != addr[:2]:
            # Latch onto the first source (symmetric RTP: works behind NAT); switch only when it went quiet,
            # so packets injected from elsewhere cannot break into a live call's audio.
            if self.source is not None and now - self.last_packet < self.LATCH_HOLD_S:
                self.stats.other_stream += 1
                return
            self.source = addr[:2]
        self.stats.packets += 1
        self.last_packet = now
        if packet.payload_type == plan.dtmf_payload_type:
            self.stats.dtmf_packets += 1
            try:
                digits = self.dtmf.push(packet.ssrc, packet.timestamp, packet.payload)
            except DtmfError:
                self.stats.malformed += 1
                return
            self._deliver(digits)
        elif packet.payload_type == plan.payload_type:
            if self.first_audio_at is None:
                self.first_audio_at = self.clock.now()
            pcm = plan.codec.decode(packet.payload)
            self.jitter.push(packet.ssrc, packet.seq, packet.timestamp, pcm, packet.marker)
        elif packet.payload_type == COMFORT_NOISE_PT:
            self.stats.comfort_noise += 1
        else:
            self.stats.unknown_payload += 1

    def _deliver(self, digits: list[DtmfDigit]) -> None:
        for d in digits:
            self.digits.append(d)
            if self.on_digit is not None:
                self.on_digit(d)

    def poll_dtmf(self) -> None:
        self._deliver(self.dtmf.poll())


class CallMedia:
    """The RTP side of one call, from port allocation to close."""

    def __init__(
        self, ip: str, pool: PortPool, allowed: Callable[[str], bool], clock: Clock, jitter_ms: int,
        jitter_min_ms: int | None = None,
    ) -> None:
        self.ip = ip
        self.pool = pool
        self.receiver = RtpReceiver(allowed, clock, jitter_ms, jitter_min_ms)
        self.clock = clock
        self.output = RtpAudioOutput(clock)
        self.port = 0
        self.sender: RtpSender | None = None
        self.frames_pushed = 0
        self.push_errors = 0
        self._bound: Bound | None = None
        self._playout: asyncio.Task[None] | None = None

    async def bind(self) -> int:
        """Take an RTP port from the pool; raises OSError when none is free."""
        self._bound = await self.pool.bind(self.ip, lambda: self.receiver)
        self.port = self._bound.port
        return self.port

    def start(self, plan: MediaPlan, sink: AudioSink) -> None:
        """Begin both directions once the call is answered."""
        assert self._bound is not None
        self.receiver.plan = plan
        self.receiver.on_digit = lambda d: sink.push_dtmf(d.digit, d.duration_ms)
        self.sender = RtpSender(self._bound.sock, self.output, plan)
        PACER.add(self.sender)
        self._playout = asyncio.get_running_loop().create_task(self._play_out(sink), name=f"rtp-recv-{self.port}")

    def update(self, plan: MediaPlan) -> None:
        self.receiver.plan = plan
        if self.sender is not None:
            self.sender.update(plan)

    def seconds_since_packet(self) -> float:
        return time.monotonic() - self.receiver.last_packet

    async def _play_out(self, sink: AudioSink) -> None:
        loop = asyncio.get_running_loop()
        slot = loop.time()
        jitter = self.receiver.jitter
        while True:
            delay = slot - loop.time()
            if delay < -1.0:
                slot = loop.time()  # the session stalled for a second: do not replay a backlog in a burst
            # Yield even when behind: a catch-up run that never yields would pop frames whose packets are
            # still waiting in the socket (asyncio reads one datagram per loop pass) and call them lost.
            await asyncio.sleep(max(0.0, delay))
            slot += PTIME_S
            try:
                self.receiver.poll_dtmf()
                item = jitter.pop()
                if item is None:
                    continue
                t0 = self.receiver.first_audio_at or 0.0
                frame = AudioFrame(item[0], RATE, t0 + self.frames_pushed * PTIME_S)
                self.frames_pushed += 1
                await sink.push_audio(frame)
            except Exception:
                # The session choking on one frame must not silence the rest of the call.
                self.push_errors += 1
                if self.push_errors == 1:
                    log.exception("caller audio on port %d was not accepted; going on", self.port)

    async def close(self) -> None:
        if self._playout is not None:
            self._playout.cancel()
            try:
                await self._playout
            except asyncio.CancelledError:
                pass
        if self.sender is not None:
            PACER.remove(self.sender)
        if self._bound is not None:
            self._bound.transport.close()
            self._bound.rtcp.close()
        if self.port:
            self.pool.release(self.port)
            self.port = 0

    def stats(self) -> dict[str, Any]:
        rx = asdict(self.receiver.stats) | asdict(self.receiver.jitter.stats)
        rx["lost"] = self.receiver.jitter.loss()
        rx["seconds_received"] = self.receiver.jitter.stats.samples_received / RATE
        out: dict[str, Any] = {"rx": rx, "frames_pushed": self.frames_pushed, "push_errors": self.push_errors}
        out["dtmf"] = "".join(d.digit for d in self.receiver.digits)
        if self.sender is not None:
            s = self.sender.stats
            out["tx"] = asdict(s) | {"mean_late_ms": round(s.mean_late_ms, 3), "max_late_ms": round(s.max_late_ms, 3)}
            out["tx"]["seconds_of_agent_audio"] = self.output.samples_sent / RATE
            out["tx"]["pacer_realtime"] = PACER.realtime
        return out

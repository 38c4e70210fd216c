"""Paced RTP sending: one packet every 20 ms per call, on an absolute schedule, off the event loop.

The event loop also runs the pipeline's own Python work (VAD, turn logic, resampling), and
with the models busy it was measured to stall for up to 70 ms, which would reach the caller
as late packets. So one `Pacer` thread sends for every call. It needs the GIL for only a few
microseconds per packet, and it asks the OS for real-time scheduling (SCHED_FIFO) where that
is allowed, as audio threads do: on a loaded 2-core host, during a real agent reply, that
took 99% of gaps to within 2 ms of 20 ms (from 81%), and the worst from 19 ms to 12 ms;
with the interpreter's switch interval also lowered to 1 ms (`serve sip` does this), the
worst gap was 3 ms.

Each tick is scheduled at ``t0 + n * 20 ms`` rather than "sleep 20 ms", so jitter never
accumulates into drift. Missed ticks are sent at once with their own timestamps; after a
stall longer than `MAX_CATCHUP_S` the schedule restarts, the RTP timestamp jumps by the
time that passed and the marker bit is set, which is what a receiver expects after a gap.
The stream is continuous: between the agent's talk spurts the sender keeps sending G.711
silence, so NAT bindings and a trunk's RTP-timeout watchdog stay happy, and the marker bit
flags the first packet of each spurt.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass

from .output import FRAME, RATE, RtpAudioOutput
from .rtp import RtpPacket
from .sdp import MediaPlan

log = logging.getLogger("voice.sip.media")
PTIME_S = FRAME / RATE
MAX_CATCHUP_S = 0.2


@dataclass
class SendStats:
    packets: int = 0
    audio_packets: int = 0
    talk_spurts: int = 0
    schedule_resets: int = 0
    send_errors: int = 0
    max_late_ms: float = 0.0  # worst lateness of a send against its slot on the schedule
    total_late_ms: float = 0.0

    @property
    def mean_late_ms(self) -> float:
        return self.total_late_ms / self.packets if self.packets else 0.0


class RtpSender:
    """One call's outgoing stream; `tick` runs on the pacer thread."""

    def __init__(self, sock: socket.socket, output: RtpAudioOutput, plan: MediaPlan) -> None:
        self.sock = sock
        self.output = output
        self.plan = plan  # replaced whole by the event loop on re-INVITE; read once per tick
        self.ssrc = secrets.randbits(32)
        self.seq = secrets.randbits(16)
        self.timestamp = secrets.randbits(32)
        self.stats = SendStats()
        self._resume_marker = True  # the first packet of the stream starts a spurt

    def update(self, plan: MediaPlan) -> None:
        """A re-INVITE changed the media (hold, unhold, new address or codec)."""
        if plan.can_send and not self.plan.can_send:
            self._resume_marker = True
        self.plan = plan

    def skip(self, ticks: int) -> None:
        self.timestamp = (self.timestamp + ticks * FRAME) & 0xFFFFFFFF
        self._resume_marker = True
        self.stats.schedule_resets += 1

    def tick(self, late_s: float, next_slot_call_time: float) -> None:
        pcm, spurt_start = self.output.next_frame()
        self.output.set_next_send(next_slot_call_time)
        plan = self.plan
        if plan.can_send:
            payload = plan.codec.encode(pcm) if pcm is not None else plan.codec.silence_payload(FRAME)
            marker = spurt_start or self._resume_marker
            packet = RtpPacket(plan.payload_type, self.seq, self.timestamp, self.ssrc, payload, marker)
            try:
                self.sock.sendto(packet.to_bytes(), (plan.remote_ip, plan.remote_port))
            except OSError:
                self.stats.send_errors += 1  # the peer's RTP timeout or BYE ends the call, not us
            self.seq = (self.seq + 1) & 0xFFFF
            self._resume_marker = False
            self.stats.packets += 1
            self.stats.audio_packets += pcm is not None
            self.stats.talk_spurts += spurt_start
            self.stats.max_late_ms = max(self.stats.max_late_ms, late_s * 1000)
            self.stats.total_late_ms += late_s * 1000
        elif spurt_start:
            self._resume_marker = True
        self.timestamp = (self.timestamp + FRAME) & 0xFFFFFFFF  # time passes on hold too


def _request_realtime() -> bool:
    """SCHED_FIFO for the calling thread, if the OS lets us (root or CAP_SYS_NICE); else nothing changes."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))  # pid 0: this thread, on Linux
        return True
    except (AttributeError, OSError):
        return False


class Pacer:
    """The thread that ticks every registered sender each 20 ms; it runs while any are registered."""

    def __init__(self) -> None:
        self._senders: set[RtpSender] = set()
        self._lock = threading.Lock()  # guards _senders and serialises ticks against removal
        self._thread: threading.Thread | None = None
        self.realtime: bool | None = None  # whether the thread got real-time scheduling

    def add(self, sender: RtpSender) -> None:
        with self._lock:
            self._senders.add(sender)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rtp-pacer", daemon=True)
                self._thread.start()

    def remove(self, sender: RtpSender) -> None:
        """After this returns the sender is never ticked again."""
        with self._lock:
            self._senders.discard(sender)

    def _run(self) -> None:
        self.realtime = _request_realtime()
        if not self.realtime:
            log.info("RTP pacer runs at normal priority (no permission for SCHED_FIFO): expect more jitter under load")
        slot = time.monotonic()
        while True:
            delay = slot - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with self._lock:
                if not self._senders:
                    self._thread = None
                    return
                late = time.monotonic() - slot
                if late > MAX_CATCHUP_S:
                    missed = int(late / PTIME_S)
                    slot += missed * PTIME_S
                    late -= missed * PTIME_S
                    for s in self._senders:
                        s.skip(missed)
                for s in self._senders:
                    try:
                        s.tick(max(0.0, late), s.output.clock.now() + PTIME_S - late)
                    except Exception:
                        s.stats.send_errors += 1  # one broken call must not stop the others
                        if s.stats.send_errors == 1:
                            log.exception("RTP send tick failed")
            slot += PTIME_S


PACER = Pacer()

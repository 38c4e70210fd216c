"""Receive jitter buffer: RTP packets in, a gapless 20 ms frame stream out.

Packets are placed on the sender's timestamp axis, so reordering, loss, duplicates and any
packet size (sipp's own capture uses 30 ms packets) are handled the same way: every tick
`pop` assembles the next frame from whatever covers it. The playout cursor advances by one
frame per tick whether or not audio arrived, which keeps the call timeline continuous and
lets the pipeline's VAD see the silence after a caller stops sending.

Its depth is the delay every caller's word waits before the pipeline hears it. Fixed
(``min_ms`` None) it is ``target_ms`` from the first packet on; adaptive, it starts at
``min_ms`` and grows by one frame at each packet that came too late to be played (that packet
is lost), up to ``target_ms``. The growth is a tick with
no frame: the pipeline's timeline stays gapless and only its lag behind the wire grows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

import numpy as np

from .rtp import seq_delta, ts_delta


class FrameKind(Enum):
    AUDIO = "audio"  # fully covered by received packets
    CONCEALED = "concealed"  # a hole right after audio: the last frame faded out
    SILENCE = "silence"  # nothing received for this span


@dataclass
class JitterStats:
    received: int = 0
    duplicate: int = 0
    late: int = 0
    lost: int = 0  # RFC 3550: expected minus received, per source
    resyncs: int = 0
    grown: int = 0  # adaptive: frames of delay added after late packets
    frames_audio: int = 0
    frames_concealed: int = 0
    frames_silence: int = 0
    samples_received: int = 0  # decoded samples in unique, accepted packets


class JitterBuffer:
    """Playout buffer on the RTP timestamp axis (unwrapped to an int), fixed or adaptive."""

    LATE_RUN_RESYNC = 5  # consecutive late packets that mean the sender's clock moved

    def __init__(
        self, frame_samples: int = 160, target_ms: int = 60, max_ms: int = 500, rate: int = 8000,
        min_ms: int | None = None,
    ) -> None:
        self.frame = frame_samples
        self.target_limit = max(0, rate * target_ms // 1000)
        # the depth now: the whole target, or (adaptive) the least, grown by late packets
        self.target = self.target_limit if min_ms is None else min(self.target_limit, max(0, rate * min_ms // 1000))
        # a backlog past this is shed; a deep target keeps at least half of max_ms of room above
        # it, or a few packets ahead of the playout clock while it prebuffers are shed at once
        # (target 1000 ms with max 500: the first packets of a call were dropped after a 40 ms
        # stall of the playout loop)
        max_samples = rate * max_ms // 1000
        self.max_depth = max(self.target_limit + max(frame_samples, max_samples // 2), max_samples)
        self.stats = JitterStats()
        self._packets: dict[int, np.ndarray] = {}  # unwrapped timestamp -> samples
        self._cursor = 0
        self._ref: tuple[int, int] | None = None  # (raw ts, unwrapped ts) of the last accepted packet
        self._ssrc: int | None = None
        self._started = False
        self._playing = False  # the first frame has been popped
        self._delay_ticks = 0
        self._late_run = 0
        self._seen: set[int] = set()
        self._seen_order: deque[int] = deque()
        self._base_seq = 0
        self._max_seq = 0  # extended
        self._src_received = 0
        self._last_kind = FrameKind.SILENCE
        self._last_frame = np.zeros(frame_samples, dtype=np.int16)

    @property
    def started(self) -> bool:
        return self._started

    def depth(self) -> int:
        """Samples buffered ahead of the playout cursor."""
        if not self._packets:
            return 0
        return max(ts + len(p) for ts, p in self._packets.items()) - self._cursor

    def push(self, ssrc: int, seq: int, ts: int, pcm: np.ndarray, marker: bool = False) -> str:
        """Add one decoded packet; returns what happened to it (for stats and tests)."""
        if len(pcm) == 0:
            return "empty"
        if ssrc != self._ssrc:
            self._new_source(ssrc, seq, ts)
        elif seq in self._seen:
            self.stats.duplicate += 1
            return "duplicate"
        assert self._ref is not None
        ext = self._ref[1] + ts_delta(self._ref[0], ts)
        end = ext + len(pcm)
        if self._started and not self._playing and self._cursor - self.target <= ext < self._cursor:
            self._cursor = ext  # an earlier packet overtaken by the first one: still before playout starts
        if end <= self._cursor:
            self._late_run += 1
            if marker or self._late_run >= self.LATE_RUN_RESYNC:
                ext = self._reanchor(ts)  # a talk spurt on a new timestamp base, or a slower sender
            else:
                self.stats.late += 1
                self._remember(seq)
                self._count_seq(seq)
                self._grow()
                return "late"
        elif end - self._cursor > self.max_depth + len(pcm):
            if ext - self._ref[1] > self.max_depth:
                ext = self._reanchor(ts)  # the sender's timestamps jumped
            else:
                self._skip_to(ext - self.target)  # a sender running fast, or a burst: shed the backlog
        self._late_run = 0
        self._ref = (ts, ext)
        if ext in self._packets:
            self.stats.duplicate += 1
            return "duplicate"
        self._packets[ext] = pcm
        self._remember(seq)
        self._count_seq(seq)
        self.stats.received += 1
        self.stats.samples_received += len(pcm)
        if not self._started:
            self._started = True
            self._delay_ticks = self.target // self.frame
        return "ok"

    def pop(self) -> tuple[np.ndarray, FrameKind] | None:
        """The next frame, or None while nothing has arrived yet (or the prebuffer fills)."""
        if not self._started:
            return None
        if self._delay_ticks > 0:
            self._delay_ticks -= 1
            return None
        self._playing = True
        lo, hi = self._cursor, self._cursor + self.frame
        out = np.zeros(self.frame, dtype=np.int16)
        covered = 0
        for ts in sorted(self._packets):
            if ts >= hi:
                break
            pcm = self._packets[ts]
            a, b = max(lo, ts), min(hi, ts + len(pcm))
            if b > a:
                out[a - lo : b - lo] = pcm[a - ts : b - ts]
                covered += b - a
            if ts + len(pcm) <= hi:
                del self._packets[ts]
        self._cursor = hi
        if covered:
            kind = FrameKind.AUDIO
            self.stats.frames_audio += 1
            self._last_frame = out
        elif self._last_kind is FrameKind.AUDIO:
            # Fading the previous frame out avoids the click of audio stopping dead.
            out = (self._last_frame * np.linspace(1.0, 0.0, self.frame)).astype(np.int16)
            kind = FrameKind.CONCEALED
            self.stats.frames_concealed += 1
        else:
            kind = FrameKind.SILENCE
            self.stats.frames_silence += 1
        self._last_kind = kind
        return out, kind

    def _grow(self) -> None:
        """A packet came after its frame was played: one more frame of delay, if the target allows."""
        if self._playing and self.target + self.frame <= self.target_limit:
            self.target += self.frame
            self._delay_ticks += 1
            self.stats.grown += 1

    def _new_source(self, ssrc: int, seq: int, ts: int) -> None:
        if self._ssrc is not None:
            self._close_source()
            self.stats.resyncs += 1
        self._ssrc = ssrc
        self._seen.clear()
        self._seen_order.clear()
        self._base_seq = self._max_seq = seq
        self._src_received = 0
        self._ref = (ts, self._anchor())

    def _anchor(self) -> int:
        """Where a stream with a new timestamp base starts: after what is buffered, one target ahead."""
        ahead = self._cursor + (self.target if self._started else 0)
        return max([ahead] + [t + len(p) for t, p in self._packets.items()])

    def _reanchor(self, ts: int) -> int:
        self.stats.resyncs += 1
        self._late_run = 0
        ext = self._anchor()
        self._ref = (ts, ext)
        return ext

    def _skip_to(self, cursor: int) -> None:
        self.stats.resyncs += 1
        self._cursor = cursor
        for t in [t for t, p in self._packets.items() if t + len(p) <= cursor]:
            del self._packets[t]

    def _remember(self, seq: int) -> None:
        self._seen.add(seq)
        self._seen_order.append(seq)
        if len(self._seen_order) > 512:
            self._seen.discard(self._seen_order.popleft())

    def _count_seq(self, seq: int) -> None:
        self._src_received += 1
        ext = self._max_seq + seq_delta(self._max_seq & 0xFFFF, seq)
        if ext > self._max_seq:
            self._max_seq = ext
        elif ext < self._base_seq:
            self._base_seq = ext

    def _close_source(self) -> None:
        if self._src_received:
            expected = self._max_seq - self._base_seq + 1
            self.stats.lost += max(0, expected - self._src_received)

    def loss(self) -> int:
        """Packets lost so far (closed sources plus the current one)."""
        current = 0
        if self._src_received:
            current = max(0, self._max_seq - self._base_seq + 1 - self._src_received)
        return self.stats.lost + current

"""The agent's voice on a phone call: an `AudioOutput` at 8 kHz that the RTP sender drains.

All agent audio goes into one sample FIFO, and packets are cut from that FIFO 160 samples
at a time. Chunk boundaries from TTS therefore never line up with packet boundaries and are
never padded, which is what makes other bridges click: each chunk padded to a packet, or
each chunk resampled on its own. The only places a waveform is cut are the end of the
queued audio and a barge-in; both get a short fade to zero.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from voice.transports.base import Clock

RATE = 8000
FRAME = 160  # 20 ms
FADE = 40  # 5 ms: long enough to remove the click, short enough not to be heard as a fade


def _fade_out(pcm: np.ndarray) -> np.ndarray:
    n = min(len(pcm), FADE)
    out = pcm.astype(np.float32)
    out[len(out) - n :] *= np.linspace(1.0, 0.0, n + 1, dtype=np.float32)[1:]
    return out.astype(np.int16)


class RtpAudioOutput:
    """Queue of agent PCM; `next_frame` is called by the pacer thread once per 20 ms tick.

    The session calls the `AudioOutput` methods on the event loop while the pacer drains the
    queue from its own thread, so every method takes the lock (held for microseconds).
    """

    sample_rate = RATE

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._chunks: deque[np.ndarray] = deque()
        self._queued = 0
        self._head = 0  # samples already taken from _chunks[0]
        self._next_send: float | None = None  # call time of the sender's next tick
        self._audio_end = 0.0  # call time at which the last agent audio sent finishes
        self._in_spurt = False
        self.turn = 0
        self._heard = 0  # samples of agent audio sent since begin_turn
        self.samples_sent = 0
        self.spurts = 0
        self._lock = threading.Lock()

    # --- AudioOutput, called by the session on the event loop ---

    def begin_turn(self, turn: int) -> None:
        with self._lock:
            self.turn = turn
            self._heard = 0

    def play(self, pcm: np.ndarray) -> float:
        pcm = np.ascontiguousarray(pcm, dtype=np.int16).reshape(-1)
        with self._lock:
            start = self._first_slot() + self._queued / RATE
            if len(pcm):
                self._chunks.append(pcm)
                self._queued += len(pcm)
        return start

    def interrupt(self) -> float:
        with self._lock:
            return self._interrupt()

    def _interrupt(self) -> float:
        heard = self._heard / RATE
        if self._queued:
            tail = _fade_out(self._take(min(self._queued, FADE)))
            self._chunks.clear()
            self._head = 0
            self._queued = 0
            self._chunks.append(tail)
            self._queued = len(tail)
        return heard

    def busy_until(self) -> float:
        with self._lock:
            if self._queued:
                return self._first_slot() + self._queued / RATE
            return self._audio_end  # idle: in the past once the last packet has played

    def _first_slot(self) -> float:
        """Call time at which the next queued sample goes out."""
        now = self.clock.now()
        return now if self._next_send is None else max(now, self._next_send)

    # --- the sender side ---

    def set_next_send(self, call_time: float) -> None:
        self._next_send = call_time

    def next_frame(self) -> tuple[np.ndarray | None, bool]:
        """160 samples of agent audio (None for silence) and whether a talk spurt starts here."""
        with self._lock:
            return self._next_frame()

    def _next_frame(self) -> tuple[np.ndarray | None, bool]:
        if self._queued == 0:
            self._in_spurt = False
            return None, False
        starts = not self._in_spurt
        if starts:
            self.spurts += 1
        n = min(self._queued, FRAME)
        self._audio_end = self._first_slot() + n / RATE
        pcm = self._take(n)
        self._heard += n
        self.samples_sent += n
        if self._queued == 0:
            # The queued audio ends in this packet: fade it and pad with true silence.
            pcm = np.concatenate([_fade_out(pcm), np.zeros(FRAME - n, dtype=np.int16)])
            self._in_spurt = False
        else:
            self._in_spurt = True
        return pcm, starts

    def _take(self, n: int) -> np.ndarray:
        parts = []
        while n > 0 and self._chunks:
            chunk = self._chunks[0]
            avail = len(chunk) - self._head
            k = min(avail, n)
            parts.append(chunk[self._head : self._head + k])
            self._head += k
            n -= k
            self._queued -= k
            if self._head == len(chunk):
                self._chunks.popleft()
                self._head = 0
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

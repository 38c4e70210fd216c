"""The replay transport's output: agent audio placed on the input file's own timeline.

Channel 1 of OUT.wav is what the caller would hear, sample-aligned with the input: a chunk
queued at call time t starts at max(t + buffer, end of audio already queued).
"""

from __future__ import annotations

import numpy as np

from voice.transports.base import Clock


class TimelineOutput:
    def __init__(self, sample_rate: int, clock: Clock, buffer_ms: int = 20, capacity_s: float = 60.0) -> None:
        self.sample_rate = sample_rate
        self.clock = clock
        self.buffer_s = buffer_ms / 1000.0
        self.track = np.zeros(int(capacity_s * sample_rate), dtype=np.int16)
        self._busy_until = 0.0
        self._turn_start: float | None = None

    def begin_turn(self, turn: int) -> None:
        self._turn_start = None

    def play(self, pcm: np.ndarray) -> float:
        start = max(self.clock.now() + self.buffer_s, self._busy_until)
        i = int(round(start * self.sample_rate))
        end = i + len(pcm)
        if end > len(self.track):
            self.track = np.concatenate([self.track, np.zeros(end - len(self.track) + self.sample_rate, np.int16)])
        self.track[i:end] = pcm
        self._busy_until = end / self.sample_rate
        if self._turn_start is None:
            self._turn_start = start
        return start

    def interrupt(self) -> float:
        now = self.clock.now()
        cut = now + self.buffer_s  # what is already in the output buffer still plays
        if cut < self._busy_until:
            self.track[int(round(cut * self.sample_rate)) : int(round(self._busy_until * self.sample_rate)) + 1] = 0
            self._busy_until = cut
        heard = 0.0 if self._turn_start is None else max(0.0, min(cut, self._busy_until) - self._turn_start)
        return heard

    def busy_until(self) -> float:
        return self._busy_until

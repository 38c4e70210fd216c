"""Voice activity detection with webrtcvad, and a segmenter that turns per-frame decisions
into speech-start and pause events stamped on the call timeline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import webrtcvad

from voice.audio import AudioFrame
from voice.level import LevelGate

_RATES = (8000, 16000, 32000, 48000)


class WebRtcVad:
    """One webrtcvad instance for one sample rate and frame size (10, 20 or 30 ms)."""

    def __init__(self, aggressiveness: int = 2, sample_rate: int = 16000, frame_ms: int = 20) -> None:
        if sample_rate not in _RATES:
            raise ValueError(f"webrtcvad supports {_RATES} Hz, not {sample_rate}")
        if frame_ms not in (10, 20, 30):
            raise ValueError("webrtcvad frames are 10, 20 or 30 ms")
        self.sample_rate = sample_rate
        self.frame_ms = frame_ms
        self.frame_len = sample_rate * frame_ms // 1000
        self._vad = webrtcvad.Vad(aggressiveness)

    def is_speech(self, pcm: np.ndarray) -> bool:
        if len(pcm) != self.frame_len:
            raise ValueError(f"expected {self.frame_len} samples, got {len(pcm)}")
        return self._vad.is_speech(pcm.astype(np.int16, copy=False).tobytes(), self.sample_rate)


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "start" | "pause" | "voiced" | "unvoiced"
    t: float  # "start": first voiced sample; "pause": end of the last voiced frame


class VadSegmenter:
    """Hysteresis over frame decisions.

    - speech starts after ``start_ms`` of (mostly) voiced frames; ``t`` is the first of them;
    - a pause is reported after ``stop_ms`` of unvoiced frames; ``t`` is the end of the last
      voiced frame, which is what the turn gap is measured from.

    With a ``gate`` (`LevelGate`), a frame far quieter than the caller's speech is unvoiced
    whatever webrtcvad says: its hangover and a line's hiss do not lengthen the turn.

    Every frame also yields its raw decision, so the turn manager can measure silence to
    the frame. Input frames may be any length; they are re-cut to the VAD frame size.
    """

    def __init__(self, vad: WebRtcVad, start_ms: int = 60, stop_ms: int = 120,
                 gate: LevelGate | None = None) -> None:
        self.vad = vad
        self.gate = gate
        self.start_frames = max(1, start_ms // vad.frame_ms)
        self.stop_frames = max(1, stop_ms // vad.frame_ms)
        self.in_speech = False
        self._buf = np.zeros(0, dtype=np.int16)
        self._buf_t = 0.0
        self._voiced_run: list[float] = []
        self._unvoiced = 0
        self.last_voiced_end = 0.0

    def process(self, frame: AudioFrame) -> list[VadEvent]:
        if frame.sample_rate != self.vad.sample_rate:
            raise ValueError(f"VAD runs at {self.vad.sample_rate} Hz, frame is {frame.sample_rate} Hz")
        if len(self._buf) == 0:
            self._buf_t = frame.timestamp
        self._buf = np.concatenate([self._buf, frame.pcm])
        events: list[VadEvent] = []
        n = self.vad.frame_len
        while len(self._buf) >= n:
            chunk, self._buf = self._buf[:n], self._buf[n:]
            t0 = self._buf_t
            self._buf_t += n / self.vad.sample_rate
            events.extend(self._step(chunk, t0, self._buf_t))
        return events

    def _step(self, chunk: np.ndarray, t0: float, t1: float) -> list[VadEvent]:
        voiced = self.vad.is_speech(chunk)
        if self.gate is not None:
            # called every frame: the gate keeps the levels of silence too (its noise floor)
            voiced = self.gate.loud(chunk, self.vad.sample_rate) and voiced
        out = [VadEvent("voiced" if voiced else "unvoiced", t1)]
        if voiced:
            self.last_voiced_end = t1
            self._unvoiced = 0
            if not self.in_speech:
                self._voiced_run.append(t0)
                if len(self._voiced_run) >= self.start_frames:
                    self.in_speech = True
                    out.append(VadEvent("start", self._voiced_run[0]))
                    self._voiced_run = []
        else:
            if not self.in_speech:
                self._voiced_run = []
            else:
                self._unvoiced += 1
                if self._unvoiced == self.stop_frames:
                    self.in_speech = False
                    out.append(VadEvent("pause", self.last_voiced_end))
        return out

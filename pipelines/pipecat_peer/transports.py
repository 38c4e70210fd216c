"""A recorded call as Pipecat's input transport, and a real-time speaker as its output.

`ReplayInputTransport` hands the recording over at real-time pace in 20 ms frames (frame i
at ``t0 + (i + 1) * 20 ms``), then silence until the pipeline stops, as a live microphone
would. `PacedOutputTransport` plays what it is given on a simulated real-time speaker and
keeps it, placed on the timeline at 16 kHz, with the start of every stretch of agent audio.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    StartFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams

from pipelines.peer_replay import played_track
from voice.audio import resample

RATE = 16000
FRAME = RATE // 50  # 20 ms


class ReplayInputTransport(BaseInputTransport):
    def __init__(self, pcm16k: np.ndarray, **kwargs: object) -> None:
        super().__init__(TransportParams(audio_in_enabled=True, audio_in_sample_rate=RATE), **kwargs)  # type: ignore[arg-type]
        self.pcm = pcm16k.astype(np.int16, copy=False)
        self.t0: float | None = None
        self.finished = asyncio.Event()  # the whole recording was handed over
        self._feeder: asyncio.Task[None] | None = None

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)
        if self._feeder is None:
            self._feeder = self.create_task(self._feed(), "replay-feed")

    async def stop(self, frame: EndFrame) -> None:
        await self._stop_feeding()
        await super().stop(frame)

    async def cancel(self, frame: CancelFrame) -> None:
        await self._stop_feeding()
        await super().cancel(frame)

    async def _stop_feeding(self) -> None:
        if self._feeder is not None:
            await self.cancel_task(self._feeder)
            self._feeder = None

    async def _feed(self) -> None:
        self.t0 = time.monotonic()
        i = 0
        while True:
            await asyncio.sleep(max(0.0, self.t0 + (i + 1) * FRAME / RATE - time.monotonic()))
            chunk = self.pcm[i * FRAME : (i + 1) * FRAME]
            if len(chunk) < FRAME:
                self.finished.set()
                chunk = np.pad(chunk, (0, FRAME - len(chunk)))
            await self.push_audio_frame(InputAudioRawFrame(audio=chunk.tobytes(), sample_rate=RATE, num_channels=1))
            i += 1


class PacedOutputTransport(BaseOutputTransport):
    """A speaker that plays in real time. A write returns once no more than ``buffer_s`` plus
    the frame itself is queued ahead, so Pipecat's output queue drains at the speaker's pace
    and an interruption drops what it still holds; what is in the playout buffer
    (``buffer_s``, as our own output has: `output.buffer_ms`) still plays."""

    def __init__(self, buffer_s: float = 0.0, **kwargs: object) -> None:
        super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=RATE), **kwargs)  # type: ignore[arg-type]
        self.buffer_s = buffer_s
        self.onsets: list[float] = []  # (monotonic) a stretch of agent audio began
        self.chunks: list[tuple[float, np.ndarray]] = []  # (monotonic start, 16 kHz pcm)
        self.play_end = 0.0

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        pcm = np.frombuffer(frame.audio, dtype=np.int16)
        if frame.num_channels > 1:
            pcm = pcm.reshape(-1, frame.num_channels).mean(axis=1).astype(np.int16)
        if frame.sample_rate != RATE:
            pcm = resample(pcm, frame.sample_rate, RATE)
        if not len(pcm):
            return True
        now = time.monotonic()
        at = max(now + self.buffer_s, self.play_end)
        if at > self.play_end:  # the speaker was idle
            self.onsets.append(at)
        self.chunks.append((at, pcm))
        duration = len(pcm) / RATE
        self.play_end = at + duration
        await asyncio.sleep(max(0.0, self.play_end - self.buffer_s - duration - time.monotonic()))
        return True

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame):
            self._cut(time.monotonic() + self.buffer_s)

    def _cut(self, at: float) -> None:
        kept = []
        for start, pcm in self.chunks:
            if start < at:
                kept.append((start, pcm[: int((at - start) * RATE)]))
        self.chunks = kept
        self.play_end = min(self.play_end, at)

    def audio(self, t0: float, duration_s: float) -> np.ndarray:
        """What the speaker played, as 16 kHz PCM on the input's timeline (0 = ``t0``)."""
        return played_track(self.chunks, t0, duration_s)

"""Our faster-whisper engine as a Pipecat segmented STT service.

Pipecat's own local Whisper service (`pipecat.services.whisper.stt.WhisperSTTService`) is a
`SegmentedSTTService`: it buffers the caller's audio while the VAD says speech, pads each
segment with 0.5 s of silence when the VAD stops, and transcribes it in one call. This does the
same with our `WhisperEngine` (blocking, so in a worker thread), and drops a segment Whisper
thinks holds no speech at Pipecat's default threshold (``no_speech_prob`` 0.4). Each
transcript is final, so the turn can end as soon as it arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
from pipecat.frames.frames import Frame, TranscriptionFrame
from pipecat.services.settings import STTSettings
from pipecat.services.stt_latency import WHISPER_TTFS_P99
from pipecat.services.stt_service import SegmentedSTTService
from pipecat.transcriptions.language import Language
from pipecat.utils.time import time_now_iso8601

from voice.asr import WhisperEngine
from voice.audio import resample

RATE = 16000
NO_SPEECH_PROB = 0.4  # WhisperSTTService's default


class WhisperSegmentedSTT(SegmentedSTTService):
    def __init__(self, engine: WhisperEngine, **kwargs: object) -> None:
        kwargs.setdefault("ttfs_p99_latency", WHISPER_TTFS_P99)
        kwargs.setdefault("settings", STTSettings(model="faster-whisper", language=Language.EN))
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.engine = engine

    @property
    def wants_wav_segments(self) -> bool:
        return False  # raw 16-bit PCM, as Pipecat's local Whisper takes it

    def can_generate_metrics(self) -> bool:
        return True

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame, None]:
        pcm = np.frombuffer(audio, dtype=np.int16)
        if self.sample_rate != RATE:
            pcm = resample(pcm, self.sample_rate, RATE)
        await self.start_processing_metrics()
        res = await asyncio.to_thread(self.engine.transcribe, pcm.astype(np.float32) / 32768.0)
        await self.stop_processing_metrics()
        text = res.text.strip()
        if text and res.no_speech_prob < NO_SPEECH_PROB:
            yield TranscriptionFrame(text, self._user_id, time_now_iso8601(), Language.EN)

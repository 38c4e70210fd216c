"""Our Piper engine as a Pipecat TTS service.

Pipecat's TTS base aggregates the LLM's text into sentences and calls `run_tts` once per
sentence. Each sentence is said clause by clause with a short first clause (`PiperTTS.split`,
as the LiveKit plugin does), each synthesised in a worker thread and resampled from Piper's
22050 Hz to the pipeline's output rate in one piece (a streaming resampler would hold the
start of each clause back).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from pipecat.frames.frames import Frame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService

from voice.audio import resample
from voice.tts import PiperTTS


class PiperTTSService(TTSService):
    def __init__(self, piper: PiperTTS, **kwargs: Any) -> None:
        kwargs.setdefault("settings", TTSSettings(model="piper", voice=None, language=None))
        super().__init__(push_start_frame=True, push_stop_frames=True, **kwargs)
        self.piper = piper

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        await self.start_tts_usage_metrics(text)
        for part in self.piper.split(text):
            pcm = await asyncio.to_thread(self.piper.synth, part)
            if not len(pcm):
                continue
            pcm = resample(pcm, self.piper.sample_rate, self.sample_rate)
            await self.stop_ttfb_metrics()
            yield TTSAudioRawFrame(pcm.astype("<i2", copy=False).tobytes(), self.sample_rate, 1, context_id=context_id)
        await self.stop_ttfb_metrics()

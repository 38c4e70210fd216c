"""Piper as a streaming livekit-agents TTS plugin.

Text arrives in pieces (an LLM's chunks). Each complete sentence is synthesised as soon as it
is in, and Piper's first clause is kept short (`PiperTTS.split`), so first audio does not
wait for the whole reply. Synthesis runs on Piper's worker pool (`voice.workers`), one clause
at a time, a first clause ahead of other calls' later clauses, and stops between clauses when
LiveKit cancels the stream (an interruption).
"""

from __future__ import annotations

import re

from livekit.agents import tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions

from voice.tts import PiperTTS
from voice.workers import AHEAD, NOW

_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s+")


def complete_sentences(text: str) -> tuple[str, str]:
    """Split ``text`` into (complete sentences, unfinished rest)."""
    ends = list(_SENTENCE_END.finditer(text))
    if not ends:
        return "", text
    cut = ends[-1].end()
    return text[:cut].strip(), text[cut:]


class PiperStreamingTTS(tts.TTS):
    def __init__(self, piper: PiperTTS) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True), sample_rate=piper.sample_rate, num_channels=1
        )
        self.piper = piper

    @property
    def model(self) -> str:
        return "piper"

    @property
    def provider(self) -> str:
        return "voice-agent"

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> PiperChunkedStream:
        return PiperChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> PiperSynthesizeStream:
        return PiperSynthesizeStream(tts=self, conn_options=conn_options)


async def _speak(piper: PiperTTS, text: str, emitter: tts.AudioEmitter, first: bool = True) -> None:
    """``first``: the text opens the reply, so its first clause is what the caller waits on."""
    for i, part in enumerate(piper.split(text)):
        pcm = await piper.workers.run(piper.synth, part, priority=NOW if first and i == 0 else AHEAD)
        if len(pcm):
            emitter.push(pcm.astype("<i2", copy=False).tobytes())


class PiperChunkedStream(tts.ChunkedStream):
    _tts: PiperStreamingTTS

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._tts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            frame_size_ms=20,
        )
        await _speak(self._tts.piper, self._input_text, output_emitter)
        output_emitter.flush()


class PiperSynthesizeStream(tts.SynthesizeStream):
    _tts: PiperStreamingTTS

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._tts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            frame_size_ms=20,
            stream=True,
        )
        output_emitter.start_segment(segment_id=utils.shortuuid())
        pending = ""
        spoken = False
        async for data in self._input_ch:
            if isinstance(data, self._FlushSentinel):
                ready, pending = pending.strip(), ""
            else:
                ready, pending = complete_sentences(pending + data)
            if ready:
                self._mark_started()
                await _speak(self._tts.piper, ready, output_emitter, first=not spoken)
                spoken = True
                output_emitter.flush()
        if pending.strip():
            self._mark_started()
            await _speak(self._tts.piper, pending.strip(), output_emitter, first=not spoken)
            output_emitter.flush()
        output_emitter.end_segment()

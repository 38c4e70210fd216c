"""Our streaming Whisper as a livekit-agents STT plugin.

The stream segments the audio itself with the same webrtcvad segmenter as our pipeline. For
each utterance it emits START_OF_SPEECH, then INTERIM_TRANSCRIPT every ``partial_interval_ms``
of new audio. As our own session does, it starts transcribing everything so far as soon as
``asr.tail_partial_ms`` of unvoiced audio follow a voiced frame (later audio is held back
until the caller speaks again), so when the caller pauses for ``vad.stop_ms`` that hypothesis
is already on its way and goes out as PREFLIGHT_TRANSCRIPT (LiveKit starts its preemptive
reply on it). If
the pause reaches ``final_silence_ms``, or LiveKit flushes the stream, the same hypothesis
becomes FINAL_TRANSCRIPT (cached: no second Whisper run) followed by END_OF_SPEECH; if the
caller goes on, it was only an interim. Finals wait longer than our pipeline's pause, since
a final per breath would cut words into fragments Whisper cannot read alone. Whisper runs on
the engine's worker pool (`voice.workers`); an interim, which nobody waits on, queues behind
other calls' finals and skips the 30 s window's checks (`WhisperEngine.quick_partials`), and the
stream never stops reading audio while a hypothesis is computed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import stt, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions, NotGivenOr

from pipelines.config import AsrConfig, VadConfig
from voice.asr import StreamingASR, WhisperEngine
from voice.audio import AudioFrame, StreamResampler, resample
from voice.vad import VadSegmenter, WebRtcVad
from voice.workers import AHEAD, workers_of

RATE = 16000
PRE_ROLL_S = 0.2  # audio kept from before the VAD fired: it fires after start_ms of speech


def rtc_frame_to_mono(frame: rtc.AudioFrame) -> np.ndarray:
    """int16 mono samples of an ``rtc.AudioFrame`` (interleaved channels are averaged)."""
    pcm = np.frombuffer(frame.data, dtype=np.int16)
    if frame.num_channels > 1:
        pcm = pcm.reshape(-1, frame.num_channels).astype(np.float32).mean(axis=1).astype(np.int16)
    return pcm


class WhisperSTT(stt.STT):
    def __init__(
        self,
        engine: WhisperEngine,
        *,
        asr: AsrConfig | None = None,
        vad: VadConfig | None = None,
        preflight: bool = True,
        final_silence_ms: int = 300,
    ) -> None:
        super().__init__(
            capabilities=stt.STTCapabilities(
                streaming=True, interim_results=True, offline_recognize=True, manual_flush=True
            )
        )
        self.engine = engine
        self.asr_cfg = asr or engine.cfg
        self.vad_cfg = vad or VadConfig()
        self.preflight = preflight
        self.final_silence_ms = max(final_silence_ms, self.vad_cfg.stop_ms)

    @property
    def model(self) -> str:
        return "whisper-tiny.en"

    @property
    def provider(self) -> str:
        return "voice-agent"

    async def _recognize_impl(
        self,
        buffer: utils.AudioBuffer,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions,
    ) -> stt.SpeechEvent:
        frame = rtc.combine_audio_frames(buffer) if isinstance(buffer, list) else buffer
        pcm = resample(rtc_frame_to_mono(frame), frame.sample_rate, RATE)
        res = await workers_of(self.engine).run(self.engine.transcribe, pcm.astype(np.float32) / 32768.0)
        return stt.SpeechEvent(
            type=stt.SpeechEventType.FINAL_TRANSCRIPT,
            request_id=utils.shortuuid(),
            alternatives=[_speech(res.text, self.asr_cfg.language, len(pcm) / RATE, 1.0 - res.no_speech_prob)],
        )

    def stream(
        self,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
    ) -> WhisperRecognizeStream:
        return WhisperRecognizeStream(self, conn_options=conn_options)


def _speech(
    text: str, language: str, end_time: float = 0.0, confidence: float = 1.0, start_time: float = 0.0
) -> stt.SpeechData:
    """``start_time``/``end_time``: seconds on the stream's own audio timeline (LiveKit adds
    the time its audio input started to place them on the wall clock)."""
    return stt.SpeechData(
        language=language, text=text, start_time=start_time, end_time=end_time,
        confidence=max(0.0, min(1.0, confidence)),
    )


class _Utterance:
    def __init__(self, engine: WhisperEngine, start_t: float) -> None:
        self.asr = StreamingASR(engine.transcribe, drafts=engine.drafts, quick_partials=engine.quick_partials,
                                workers=workers_of(engine))
        self.asr.reset(start_t)
        self.start_t = start_t  # stream time of the utterance's first sample (preroll included)
        self.lock = asyncio.Lock()  # StreamingASR runs one hypothesis at a time
        self.request_id = utils.shortuuid()
        self.interim_at = 0  # samples covered by the last interim
        self.interim: asyncio.Task[None] | None = None
        self.paused = False  # the caller stopped for vad.stop_ms: a candidate final is running
        # the caller may just have stopped (``asr.tail_partial_ms`` of unvoiced audio): a
        # hypothesis of everything so far is running, and later audio is held back so that
        # the candidate final at the pause is that same hypothesis, already computed
        self.holding = False
        self.tail: list[np.ndarray] = []  # audio since the hold or pause, held back from the ASR
        self.done = False

    def resume(self) -> None:
        for pcm in self.tail:
            self.asr.insert_audio(pcm)
        self.tail.clear()
        self.paused = self.holding = False


class WhisperRecognizeStream(stt.RecognizeStream):
    """Per utterance: interims while the caller speaks; at a short pause (``vad.stop_ms``) a
    candidate final starts at once and goes out as PREFLIGHT; if the pause reaches
    ``final_silence_ms`` it becomes the FINAL, at no extra cost (same audio, cached)."""

    _stt: WhisperSTT

    def __init__(self, stt_: WhisperSTT, *, conn_options: APIConnectOptions) -> None:
        super().__init__(stt=stt_, conn_options=conn_options)
        self._pending: set[asyncio.Task[Any]] = set()

    def _emit(self, ev: stt.SpeechEvent) -> None:
        if not self._event_ch.closed:
            self._event_ch.send_nowait(ev)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _run(self) -> None:
        cfg = self._stt.vad_cfg
        segmenter = VadSegmenter(WebRtcVad(cfg.aggressiveness, RATE, cfg.frame_ms), cfg.start_ms, cfg.stop_ms)
        preroll: deque[np.ndarray] = deque(maxlen=max(1, int(PRE_ROLL_S * 1000) // cfg.frame_ms))
        resampler: StreamResampler | None = None
        utt: _Utterance | None = None
        t = 0.0  # seconds of audio received: the stream's own timeline
        tail_s = self._stt.asr_cfg.tail_partial_ms / 1000
        try:
            async for item in self._input_ch:
                if isinstance(item, self._FlushSentinel):
                    if utt is not None:  # LiveKit decided the turn is over: finalize now
                        self._finish(utt, segmenter.last_voiced_end, t)
                        utt = None
                    continue
                if resampler is None or resampler.src_rate != item.sample_rate:
                    resampler = StreamResampler(item.sample_rate, RATE)
                pcm = resampler.process(rtc_frame_to_mono(item))
                if len(pcm) == 0:
                    continue
                frame = AudioFrame(pcm, RATE, t)
                t = frame.end
                for ev in segmenter.process(frame):
                    if ev.kind == "start" and utt is None:
                        held = list(preroll)
                        preroll.clear()
                        utt = _Utterance(self._stt.engine, ev.t - sum(map(len, held)) / RATE)
                        for p in held:
                            utt.asr.insert_audio(p)
                        self._emit(stt.SpeechEvent(type=stt.SpeechEventType.START_OF_SPEECH, request_id=utt.request_id))
                    elif ev.kind == "start" and utt is not None and utt.paused:
                        utt.resume()  # a breath, not the end: the candidate was only an interim
                    elif ev.kind == "voiced" and utt is not None and utt.holding and not utt.paused:
                        utt.resume()  # a dip inside speech, not the end
                    elif ev.kind == "pause" and utt is not None and not utt.paused:
                        if not utt.holding:
                            utt.asr.insert_audio(pcm)
                            pcm = pcm[:0]
                        utt.paused = True
                        self._spawn(self._candidate(utt))
                if (
                    utt is not None and not utt.paused and not utt.holding and tail_s > 0
                    and t - segmenter.last_voiced_end >= tail_s
                ):
                    utt.asr.insert_audio(pcm)
                    pcm = pcm[:0]
                    utt.holding = True
                    self._spawn(self._tail_hypothesis(utt))
                if utt is None:
                    preroll.append(pcm)
                elif utt.paused or utt.holding:
                    utt.tail.append(pcm)
                    if t - segmenter.last_voiced_end >= self._stt.final_silence_ms / 1000:
                        self._finish(utt, segmenter.last_voiced_end, t)
                        utt = None
                else:
                    utt.asr.insert_audio(pcm)
                    self._maybe_interim(utt)
            if utt is not None:
                self._finish(utt, segmenter.last_voiced_end, t)
            while self._pending:
                await asyncio.gather(*list(self._pending), return_exceptions=True)
        finally:
            for task in list(self._pending):
                task.cancel()

    def _maybe_interim(self, utt: _Utterance) -> None:
        n = int(utt.asr.duration * RATE)
        busy = utt.interim is not None and not utt.interim.done()
        if busy or n - utt.interim_at < self._stt.asr_cfg.partial_interval_ms * RATE // 1000:
            return
        utt.interim_at = n
        utt.interim = self._spawn(self._interim(utt))

    async def _interim(self, utt: _Utterance) -> None:
        async with utt.lock:
            if utt.done or utt.paused:
                return
            # nobody waits on an interim: behind other calls' finals, without the 30 s window
            upd = await utt.asr.process_iter(priority=AHEAD)
        if not utt.done and upd.partial.strip():
            self._emit_text(stt.SpeechEventType.INTERIM_TRANSCRIPT, utt, upd.partial)

    async def _tail_hypothesis(self, utt: _Utterance) -> None:
        """Everything heard so far, started ``tail_partial_ms`` after the last voiced frame:
        if the caller has stopped, the pause's candidate final finds it computed."""
        async with utt.lock:
            if utt.done or not utt.holding:
                return
            upd = await utt.asr.process_iter()
        if not utt.done and not utt.paused and upd.partial.strip():
            self._emit_text(stt.SpeechEventType.INTERIM_TRANSCRIPT, utt, upd.partial)

    async def _candidate(self, utt: _Utterance) -> None:
        async with utt.lock:
            if utt.done or not utt.paused:
                return
            upd = await utt.asr.process_iter()  # cached: FINAL of the same audio costs nothing
        if self._stt.preflight and not utt.done and utt.paused and upd.partial.strip():
            self._emit_text(stt.SpeechEventType.PREFLIGHT_TRANSCRIPT, utt, upd.partial)

    def _emit_text(self, kind: stt.SpeechEventType, utt: _Utterance, text: str) -> None:
        alt = _speech(text.strip(), self._stt.asr_cfg.language)
        self._emit(stt.SpeechEvent(type=kind, request_id=utt.request_id, alternatives=[alt]))

    def _finish(self, utt: _Utterance, speech_end: float, now_audio: float) -> None:
        utt.done = True
        # wall-clock end of speech: the stream's audio clock runs behind wall time by the
        # silence the VAD needed to see
        speech_end_time = time.time() - max(0.0, now_audio - speech_end)
        self._spawn(self._final(utt, speech_end_time, speech_end))

    async def _final(self, utt: _Utterance, speech_end_time: float, speech_end: float) -> None:
        async with utt.lock:
            upd = await utt.asr.finish()
        text = upd.partial.strip()
        self._emit(
            stt.SpeechEvent(
                type=stt.SpeechEventType.FINAL_TRANSCRIPT,
                request_id=utt.request_id,
                # the stream's timeline, not the utterance's: LiveKit reads end_time as seconds
                # since its audio input started (with the utterance's own length, a final after
                # a late commit placed the caller's last word seconds too early)
                alternatives=[_speech(text, self._stt.asr_cfg.language, speech_end, start_time=utt.start_t)],
                speech_end_time=speech_end_time,
            )
        )
        self._emit(
            stt.SpeechEvent(
                type=stt.SpeechEventType.RECOGNITION_USAGE,
                request_id=utt.request_id,
                recognition_usage=stt.RecognitionUsage(audio_duration=utt.asr.duration),
            )
        )
        self._emit(
            stt.SpeechEvent(
                type=stt.SpeechEventType.END_OF_SPEECH, request_id=utt.request_id, speech_end_time=speech_end_time
            )
        )

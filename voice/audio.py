"""The audio frame that flows through the pipeline, the one resampler, and WAV I/O.

Everything inside the pipeline is int16 mono PCM. Timestamps are seconds on the call's own
timeline (0 = the first caller sample), never wall-clock time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr


class AudioInputError(ValueError):
    """The input is not usable audio. The message is one line, meant for the user."""


@dataclass(frozen=True, slots=True)
class AudioFrame:
    pcm: np.ndarray  # int16, mono
    sample_rate: int
    timestamp: float  # seconds on the call timeline of the first sample

    def __post_init__(self) -> None:
        if self.pcm.dtype != np.int16 or self.pcm.ndim != 1:
            raise ValueError("AudioFrame.pcm must be a 1-D int16 array")
        if self.sample_rate <= 0:
            raise ValueError("AudioFrame.sample_rate must be positive")

    @property
    def duration(self) -> float:
        return len(self.pcm) / self.sample_rate

    @property
    def end(self) -> float:
        return self.timestamp + self.duration

    def resampled(self, rate: int) -> AudioFrame:
        if rate == self.sample_rate:
            return self
        return AudioFrame(resample(self.pcm, self.sample_rate, rate), rate, self.timestamp)


def resample(pcm: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Resample int16 or float audio with soxr. The one resampler used everywhere.

    For streams cut into frames use `StreamResampler`, which keeps filter state across frames
    so frame boundaries do not click.
    """
    if src_rate == dst_rate:
        return pcm
    if len(pcm) == 0:
        return pcm.copy()
    out = soxr.resample(pcm, src_rate, dst_rate, quality="HQ")
    return out.astype(pcm.dtype, copy=False)


class StreamResampler:
    """Stateful resampler for a frame stream (soxr's ResampleStream).

    ``quality`` is soxr's. The default, ``"QQ"``, returns audio for every input frame: at
    ``"HQ"`` 8 -> 16 kHz returns nothing for the first five 20 ms frames and then 100 ms at
    once (20-37 ms at 48 kHz), which would hold back every caller-side decision. ``"HQ"``
    suits whole clauses of agent speech, where nothing waits on a 20 ms frame. ``emitted``
    counts the output samples so far: the time of the next output sample is the stream's
    start plus ``emitted / dst_rate``, whatever the input frame it came out with."""

    def __init__(self, src_rate: int, dst_rate: int, quality: str = "QQ") -> None:
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self.emitted = 0
        self._rs = (
            None if src_rate == dst_rate else soxr.ResampleStream(src_rate, dst_rate, 1, dtype="int16", quality=quality)
        )

    def process(self, pcm: np.ndarray, last: bool = False) -> np.ndarray:
        out = pcm if self._rs is None else self._rs.resample_chunk(pcm.astype(np.int16, copy=False), last=last)
        self.emitted += len(out)
        return out


def float_to_int16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


def int16_to_float(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) / 32768.0


MIN_INPUT_RATE = 8000  # Hz: telephone audio; below it a 20 ms frame is a handful of samples


def check_input_rate(rate: int, source: str = "") -> None:
    """AudioInputError (prefixed by ``source``) for a sample rate under `MIN_INPUT_RATE`."""
    if rate < MIN_INPUT_RATE:
        raise AudioInputError(
            f"{source}sample rate {rate} Hz is below {MIN_INPUT_RATE} Hz, the lowest this pipeline takes "
            "(telephone audio)"
        )


def read_wav(path: str | Path, target_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Read any soundfile-readable file as int16 mono. Stereo is mixed down.

    Raises AudioInputError with a one-line reason for missing, empty or non-audio files, a
    sample rate under `MIN_INPUT_RATE`, or samples that are not finite numbers.
    """
    p = Path(path)
    if not p.exists():
        raise AudioInputError(f"{p}: no such file")
    if p.is_dir():
        raise AudioInputError(f"{p}: is a directory, not an audio file")
    if p.stat().st_size == 0:
        raise AudioInputError(f"{p}: file is empty")
    try:
        info = sf.info(str(p))
    except Exception as exc:  # soundfile raises several types for non-audio input
        raise AudioInputError(f"{p}: not a readable audio file ({str(exc).splitlines()[0][:120]})") from None
    if info.channels < 1:
        raise AudioInputError(f"{p}: audio has no channels")
    if info.frames == 0:
        raise AudioInputError(f"{p}: audio has zero samples")
    check_input_rate(info.samplerate, f"{p}: ")
    try:
        data, rate = sf.read(str(p), dtype="float32", always_2d=True)
    except Exception as exc:
        raise AudioInputError(f"{p}: could not decode audio ({str(exc).splitlines()[0][:120]})") from None
    if data.shape[0] == 0 or data.shape[1] == 0:
        raise AudioInputError(f"{p}: audio has zero samples")
    if not np.isfinite(data).all():
        raise AudioInputError(f"{p}: audio holds NaN or infinite samples (a broken float WAV)")
    mono = data.mean(axis=1)
    pcm = float_to_int16(mono)
    if target_rate is not None and target_rate != rate:
        pcm = resample(pcm, rate, target_rate)
        rate = target_rate
    return pcm, int(rate)


def write_wav(path: str | Path, pcm: np.ndarray, sample_rate: int) -> None:
    """Write int16 PCM; a 2-D array (samples, channels) writes several channels."""
    sf.write(str(path), pcm, sample_rate, subtype="PCM_16")


def frames_of(pcm: np.ndarray, sample_rate: int, frame_ms: int, start: float = 0.0) -> list[AudioFrame]:
    """Cut a signal into fixed frames; the last partial frame is zero-padded."""
    n = sample_rate * frame_ms // 1000
    out = []
    for i in range(0, len(pcm), n):
        chunk = pcm[i : i + n]
        if len(chunk) < n:
            chunk = np.concatenate([chunk, np.zeros(n - len(chunk), dtype=np.int16)])
        out.append(AudioFrame(chunk.astype(np.int16, copy=False), sample_rate, start + i / sample_rate))
    return out

"""A cached reply: its text and its audio, clause by clause, and the bytes it travels as.

Audio is kept at the TTS engine's own rate (Piper's 22.05 kHz): the session resamples it to
the transport's rate at play time exactly as it does fresh audio, so one entry serves an
8 kHz phone call and a 48 kHz browser alike, and a hit sounds the same as a miss.

On the wire (Redis) an entry is ``MAGIC``, a 4-byte header length, a JSON header (text,
clauses, sample counts, rate) and the clauses' audio concatenated as one 16-bit FLAC stream
(libsndfile via soundfile): lossless, about half the bytes of raw PCM on speech.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass

import numpy as np
import soundfile as sf

MAGIC = b"VARC1"


class EntryFormatError(ValueError):
    """The bytes are not an entry this version wrote."""


@dataclass(frozen=True)
class CachedReply:
    text: str
    clauses: tuple[str, ...]
    audio: tuple[np.ndarray, ...]  # int16 mono per clause, at ``sample_rate``
    sample_rate: int

    def __post_init__(self) -> None:
        if len(self.clauses) != len(self.audio) or not self.clauses:
            raise ValueError("a cached reply needs one audio array per clause, and at least one clause")
        for a in self.audio:
            a.setflags(write=False)  # shared by every call that hits it

    @property
    def nbytes(self) -> int:
        """What the entry holds in memory: its audio and text."""
        return sum(a.nbytes for a in self.audio) + len(self.text.encode()) + sum(len(c.encode()) for c in self.clauses)

    @property
    def duration_s(self) -> float:
        return sum(len(a) for a in self.audio) / self.sample_rate


def encode(entry: CachedReply) -> bytes:
    """Blocking (FLAC encoding): run it in a worker thread."""
    header = json.dumps({
        "text": entry.text, "clauses": list(entry.clauses), "samples": [len(a) for a in entry.audio],
        "rate": entry.sample_rate,
    }).encode()
    buf = io.BytesIO()
    sf.write(buf, np.concatenate(entry.audio), entry.sample_rate, format="FLAC", subtype="PCM_16")
    return MAGIC + struct.pack(">I", len(header)) + header + buf.getvalue()


def decode(blob: bytes) -> CachedReply:
    """Blocking (FLAC decoding): run it in a worker thread."""
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 4:
        raise EntryFormatError("not a reply-cache entry")
    (n,) = struct.unpack(">I", blob[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4
    try:
        header = json.loads(blob[start : start + n])
        pcm, rate = sf.read(io.BytesIO(blob[start + n :]), dtype="int16")
    except (ValueError, RuntimeError, sf.LibsndfileError) as exc:
        raise EntryFormatError(f"corrupt reply-cache entry: {exc}") from None
    if rate != header["rate"] or len(pcm) != sum(header["samples"]):
        raise EntryFormatError("reply-cache entry: audio does not match its header")
    cuts = np.cumsum(header["samples"])[:-1]
    audio = tuple(np.ascontiguousarray(a) for a in np.split(pcm, cuts))
    return CachedReply(header["text"], tuple(header["clauses"]), audio, int(rate))

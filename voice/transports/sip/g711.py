"""G.711 µ-law (PCMU) and A-law (PCMA) codecs, table driven.

The tables are built once from the ITU-T G.711 segment rules (the same arithmetic as the
reference Sun g711.c), so encoding is one numpy fancy-index per packet. `audioop` would do
the same but is deprecated and gone in Python 3.13.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_ALL = np.arange(-32768, 32768, dtype=np.int32)  # every int16 value, in uint16-view order below


def _ulaw_encode(x: np.ndarray) -> np.ndarray:
    v = x >> 2  # 14-bit magnitude domain
    mask = np.where(v < 0, 0x7F, 0xFF)
    v = np.minimum(np.abs(v), 8159) + (0x84 >> 2)
    seg = np.searchsorted(np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]), v)
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | ((v >> (seg + 1)) & 0x0F))
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def _ulaw_decode(u: np.ndarray) -> np.ndarray:
    u = ~u & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_encode(x: np.ndarray) -> np.ndarray:
    v = x >> 3  # 13-bit domain
    mask = np.where(v >= 0, 0xD5, 0x55)
    v = np.where(v >= 0, v, -v - 1)
    seg = np.searchsorted(np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF]), v)
    quant = np.where(seg < 2, v >> 1, v >> np.maximum(seg, 1)) & 0x0F
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | quant)
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def _alaw_decode(a: np.ndarray) -> np.ndarray:
    a = a ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


# Encode tables are indexed by the int16 sample reinterpreted as uint16.
_ORDER = _ALL.astype(np.int16).view(np.uint16)
_ULAW_ENC = np.empty(65536, dtype=np.uint8)
_ULAW_ENC[_ORDER] = _ulaw_encode(_ALL)
_ALAW_ENC = np.empty(65536, dtype=np.uint8)
_ALAW_ENC[_ORDER] = _alaw_encode(_ALL)
_ULAW_DEC = _ulaw_decode(np.arange(256, dtype=np.int32))
_ALAW_DEC = _alaw_decode(np.arange(256, dtype=np.int32))


@dataclass(frozen=True)
class G711:
    """One G.711 variant: its RTP name, static payload type and tables."""

    name: str
    payload_type: int
    silence: int  # the code for a zero sample
    _enc: np.ndarray
    _dec: np.ndarray

    sample_rate: int = 8000

    def encode(self, pcm: np.ndarray) -> bytes:
        """int16 mono samples -> one byte per sample."""
        return self._enc[np.ascontiguousarray(pcm, dtype=np.int16).view(np.uint16)].tobytes()

    def decode(self, payload: bytes) -> np.ndarray:
        """One byte per sample -> int16 mono samples."""
        return self._dec[np.frombuffer(payload, dtype=np.uint8)]

    def silence_payload(self, samples: int) -> bytes:
        return bytes([self.silence]) * samples


PCMU = G711("PCMU", 0, int(_ULAW_ENC[0]), _ULAW_ENC, _ULAW_DEC)
PCMA = G711("PCMA", 8, int(_ALAW_ENC[0]), _ALAW_ENC, _ALAW_DEC)
CODECS: dict[str, G711] = {"PCMU": PCMU, "PCMA": PCMA}

"""RTP packets (RFC 3550): parse and build the fixed header, CSRCs, extension and padding."""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HEADER = struct.Struct("!BBHII")
MAX_PACKET = 1500


class RtpError(ValueError):
    """Not a usable RTP packet; the packet is dropped and counted."""


@dataclass(frozen=True, slots=True)
class RtpPacket:
    payload_type: int
    seq: int
    timestamp: int
    ssrc: int
    payload: bytes
    marker: bool = False

    def to_bytes(self) -> bytes:
        b1 = (0x80 if self.marker else 0) | (self.payload_type & 0x7F)
        return _HEADER.pack(0x80, b1, self.seq & 0xFFFF, self.timestamp & 0xFFFFFFFF, self.ssrc) + self.payload

    @classmethod
    def parse(cls, data: bytes) -> RtpPacket:
        if len(data) < _HEADER.size:
            raise RtpError(f"packet of {len(data)} bytes is shorter than the RTP header")
        if len(data) > MAX_PACKET:
            raise RtpError(f"packet of {len(data)} bytes is larger than an RTP audio packet can be")
        b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
        if b0 >> 6 != 2:
            raise RtpError(f"RTP version {b0 >> 6}, expected 2")
        pt = b1 & 0x7F
        if 72 <= pt <= 76:
            raise RtpError("an RTCP packet on the RTP port")  # RFC 5761 demux range
        end = len(data)
        if b0 & 0x20:
            pad = data[-1]
            if pad == 0 or pad > end - _HEADER.size:
                raise RtpError(f"bad padding length {pad}")
            end -= pad
        off = _HEADER.size + 4 * (b0 & 0x0F)
        if b0 & 0x10:
            if off + 4 > end:
                raise RtpError("header extension runs past the packet")
            (words,) = struct.unpack_from("!H", data, off + 2)
            off += 4 + 4 * words
        if off > end:
            raise RtpError("header runs past the packet")
        return cls(pt, seq, ts, ssrc, bytes(data[off:end]), bool(b1 & 0x80))


def seq_delta(a: int, b: int) -> int:
    """Signed distance b - a between 16-bit sequence numbers, wrap-aware."""
    return ((b - a + 0x8000) & 0xFFFF) - 0x8000


def ts_delta(a: int, b: int) -> int:
    """Signed distance b - a between 32-bit RTP timestamps, wrap-aware."""
    return ((b - a + 0x80000000) & 0xFFFFFFFF) - 0x80000000

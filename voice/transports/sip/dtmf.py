"""DTMF: RFC 4733 telephone-event packets, and SIP INFO dtmf-relay bodies.

A key press is one event: many RTP packets share its timestamp while the duration grows,
and the end packet is sent three times. A digit is reported once, when it ends (so its
duration is known); if the end packets are all lost it is reported when the next event
starts or after `timeout_s` without news.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

EVENTS = "0123456789*#ABCD"


class DtmfError(ValueError):
    """A telephone-event payload or INFO body that does not describe a key."""


@dataclass(frozen=True, slots=True)
class DtmfDigit:
    digit: str
    duration_ms: int


def parse_event(payload: bytes) -> tuple[int, bool, int]:
    """(event code, end bit, duration in timestamp units) of the first event block."""
    if len(payload) < 4:
        raise DtmfError(f"telephone-event payload of {len(payload)} bytes, need 4")
    event, flags, duration = struct.unpack_from("!BBH", payload)
    return event, bool(flags & 0x80), duration


def build_event(event: int, end: bool, duration: int, volume: int = 10) -> bytes:
    return struct.pack("!BBH", event, (0x80 if end else 0) | (volume & 0x3F), duration & 0xFFFF)


class DtmfReceiver:
    def __init__(self, rate: int = 8000, timeout_s: float = 1.0) -> None:
        self.rate = rate
        self.timeout_s = timeout_s
        self.ignored = 0
        self._current: tuple[int, int, int] | None = None  # (ssrc, timestamp, event)
        self._duration = 0
        self._updated = 0.0
        self._done: dict[tuple[int, int], None] = {}  # insertion-ordered, oldest evicted first

    def push(self, ssrc: int, timestamp: int, payload: bytes, now: float | None = None) -> list[DtmfDigit]:
        """Feed one telephone-event packet; returns digits that completed."""
        now = time.monotonic() if now is None else now
        event, end, duration = parse_event(payload)
        if event >= len(EVENTS):
            self.ignored += 1  # flash-hook and tones are valid events but not keys
            return []
        key = (ssrc, timestamp)
        if key in self._done:
            return []  # the redundant end packets
        out: list[DtmfDigit] = []
        if self._current is not None and self._current[:2] != key:
            out.extend(self._finish())
        self._current = (ssrc, timestamp, event)
        self._duration = max(self._duration, duration)
        self._updated = now
        if end:
            out.extend(self._finish())
        return out

    def poll(self, now: float | None = None) -> list[DtmfDigit]:
        """Report a digit whose end packets never came."""
        now = time.monotonic() if now is None else now
        if self._current is not None and now - self._updated > self.timeout_s:
            return self._finish()
        return []

    def _finish(self) -> list[DtmfDigit]:
        assert self._current is not None
        ssrc, ts, event = self._current
        self._done[(ssrc, ts)] = None
        if len(self._done) > 64:
            del self._done[next(iter(self._done))]
        digit = DtmfDigit(EVENTS[event], self._duration * 1000 // self.rate)
        self._current = None
        self._duration = 0
        return [digit]


def parse_info_body(content_type: str, body: str) -> DtmfDigit:
    """SIP INFO key presses: ``application/dtmf-relay`` (Signal=5 / Duration=160) or ``application/dtmf``."""
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == "application/dtmf":
        return DtmfDigit(_digit(body.strip()), 0)
    if ctype != "application/dtmf-relay":
        raise DtmfError(f"content type {ctype!r} is not a DTMF body")
    fields = {}
    for line in body.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            fields[name.strip().lower()] = value.strip()
    if "signal" not in fields:
        raise DtmfError("dtmf-relay body has no Signal line")
    duration = fields.get("duration", "0")
    if not duration.isdigit() or len(duration) > 6:
        raise DtmfError(f"bad dtmf-relay Duration {duration[:20]!r}")
    return DtmfDigit(_digit(fields["signal"]), int(duration))


def _digit(text: str) -> str:
    if text.isdigit() and len(text) <= 2 and int(text) < len(EVENTS):
        return EVENTS[int(text)] if len(text) == 2 else text
    if len(text) == 1 and text.upper() in EVENTS:
        return text.upper()
    raise DtmfError(f"{text[:20]!r} is not a DTMF key")

"""SDP (RFC 4566) parsing and the offer/answer rules of RFC 3264 for one G.711 audio stream."""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field

from .g711 import CODECS, G711

MAX_SDP = 16_384
MAX_MEDIA = 16
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_REVERSE = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive"}


class SdpError(ValueError):
    """The body is not valid SDP (answered 400)."""


class NotAcceptable(ValueError):
    """Valid SDP with nothing we can accept (answered 488)."""


@dataclass
class Media:
    kind: str
    port: int
    proto: str
    formats: list[str]
    connection: str | None = None
    rtpmap: dict[int, tuple[str, int]] = field(default_factory=dict)  # pt -> (ENCODING, clock rate)
    direction: str | None = None


@dataclass
class Session:
    origin: str
    connection: str | None
    direction: str | None
    media: list[Media]


def parse(text: str) -> Session:
    if len(text) > MAX_SDP:
        raise SdpError(f"SDP of {len(text)} characters is too long")
    lines = [ln.rstrip("\r") for ln in text.split("\n") if ln.strip()]
    if not lines or not lines[0].startswith("v="):
        raise SdpError("SDP must start with a v= line")
    if lines[0] != "v=0":
        raise SdpError(f"unsupported SDP version {lines[0][2:12]!r}")
    origin = None
    session_conn: str | None = None
    session_dir: str | None = None
    media: list[Media] = []
    for line in lines[1:]:
        if len(line) < 2 or line[1] != "=" or not line[0].isalpha():
            raise SdpError(f"malformed SDP line {line[:40]!r}")
        kind, value = line[0], line[2:]
        current = media[-1] if media else None
        if kind == "o":
            origin = value
        elif kind == "c":
            addr = _connection(value)
            if current is None:
                session_conn = addr
            else:
                current.connection = addr
        elif kind == "m":
            if len(media) >= MAX_MEDIA:
                raise SdpError(f"more than {MAX_MEDIA} media lines")
            media.append(_media(value))
        elif kind == "a":
            name, _, arg = value.partition(":")
            if name in DIRECTIONS:
                if current is None:
                    session_dir = name
                else:
                    current.direction = name
            elif name == "rtpmap" and current is not None:
                _rtpmap(current, arg)
    if origin is None:
        raise SdpError("SDP has no o= line")
    if not media:
        raise SdpError("SDP has no m= line")
    return Session(origin, session_conn, session_dir, media)


def _connection(value: str) -> str:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError(f"malformed c= line {value[:40]!r}")
    addr = parts[2].split("/")[0]
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        raise NotAcceptable(f"connection address {addr[:40]!r} is not an IP address") from None
    if (ip.version == 4) != (parts[1] == "IP4"):
        raise SdpError(f"c= says {parts[1]} but the address is {addr[:40]!r}")
    return str(ip)


def _media(value: str) -> Media:
    parts = value.split()
    if len(parts) < 4:
        raise SdpError(f"malformed m= line {value[:40]!r}")
    port_text = parts[1].split("/")[0]
    if not port_text.isdigit() or int(port_text) > 65535:
        raise SdpError(f"bad media port {parts[1][:20]!r}")
    return Media(parts[0], int(port_text), parts[2], parts[3:])


def _rtpmap(media: Media, arg: str) -> None:
    pt_text, _, enc = arg.partition(" ")
    bits = enc.strip().split("/")
    if not pt_text.isdigit() or int(pt_text) > 127 or len(bits) < 2 or not bits[1].isdigit():
        raise SdpError(f"malformed rtpmap {arg[:40]!r}")
    media.rtpmap[int(pt_text)] = (bits[0].upper(), int(bits[1][:9]))


@dataclass(frozen=True)
class MediaPlan:
    """What was agreed for the audio stream, from our side's point of view."""

    codec: G711
    payload_type: int
    dtmf_payload_type: int | None
    remote_ip: str
    remote_port: int
    direction: str  # our direction: sendrecv / sendonly / recvonly / inactive

    @property
    def can_send(self) -> bool:
        return self.direction in ("sendrecv", "sendonly") and self.remote_port != 0 and not _is_any(self.remote_ip)

    @property
    def on_hold(self) -> bool:
        return not self.can_send


def _is_any(ip: str) -> bool:
    return ipaddress.ip_address(ip).is_unspecified  # c=0.0.0.0 is RFC 2543 hold


def _pick(media: Media, allowed: tuple[str, ...]) -> tuple[G711, int, int | None] | None:
    codec: tuple[G711, int] | None = None
    dtmf: int | None = None
    for fmt in media.formats:
        if not fmt.isdigit() or int(fmt) > 127:
            continue
        pt = int(fmt)
        name, rate = media.rtpmap.get(pt, ({0: "PCMU", 8: "PCMA"}.get(pt, ""), 8000))
        if rate != 8000:
            continue
        if codec is None and name in allowed:
            codec = (CODECS[name], pt)
        elif dtmf is None and name == "TELEPHONE-EVENT":
            dtmf = pt
    return None if codec is None else (codec[0], codec[1], dtmf)


class LocalSdp:
    """Our side of the offer/answer exchange for one dialog (keeps o= session id and version)."""

    def __init__(self, ip: str, port: int, codecs: tuple[str, ...] = ("PCMU", "PCMA"), dtmf_pt: int = 101) -> None:
        self.ip = ip
        self.port = port
        self.codecs = codecs
        self.dtmf_pt = dtmf_pt
        self._session_id = secrets.randbelow(2**31)
        self._version = self._session_id
        self._last_body: str | None = None

    def answer(self, offer: Session) -> tuple[MediaPlan, str]:
        """Accept the first usable audio stream, in the caller's codec order; reject the rest."""
        plan: MediaPlan | None = None
        lines = []
        for m in offer.media:
            picked = None if plan is not None else self._usable(m)
            if picked is None:
                lines.append(f"m={m.kind} 0 {m.proto} {' '.join(m.formats)}")
                continue
            codec, pt, dtmf = picked
            remote = m.connection or offer.connection
            if remote is None:
                raise SdpError("no c= line for the audio stream")
            direction = _REVERSE[m.direction or offer.direction or "sendrecv"]
            plan = MediaPlan(codec, pt, dtmf, remote, m.port, direction)
            lines.extend(self._audio_lines([(codec.name, pt)], dtmf, direction))
        if plan is None:
            raise NotAcceptable("no audio stream with PCMU or PCMA at 8000 Hz")
        return plan, self._body(lines)

    def offer(self, direction: str = "sendrecv") -> str:
        """Our offer, for an INVITE that came without SDP."""
        formats = [(name, CODECS[name].payload_type) for name in self.codecs]
        return self._body(self._audio_lines(formats, self.dtmf_pt, direction))

    def accept_answer(self, answer: Session) -> MediaPlan:
        """The caller's answer (in the ACK) to our offer."""
        for m in answer.media:
            if str(self.dtmf_pt) in m.formats:
                m.rtpmap.setdefault(self.dtmf_pt, ("TELEPHONE-EVENT", 8000))  # our offer defined it
            picked = self._usable(m)
            if picked is None:
                continue
            remote = m.connection or answer.connection
            if remote is None:
                raise SdpError("no c= line for the audio stream")
            codec, pt, dtmf = picked
            return MediaPlan(codec, pt, dtmf, remote, m.port, _REVERSE[m.direction or answer.direction or "sendrecv"])
        raise NotAcceptable("the answer accepted no audio codec we offered")

    def _usable(self, m: Media) -> tuple[G711, int, int | None] | None:
        if m.kind != "audio" or m.port == 0 or m.proto.upper() != "RTP/AVP":
            return None
        return _pick(m, self.codecs)

    def _audio_lines(self, formats: list[tuple[str, int]], dtmf: int | None, direction: str) -> list[str]:
        pts = [str(pt) for _, pt in formats] + ([str(dtmf)] if dtmf is not None else [])
        lines = [f"m=audio {self.port} RTP/AVP {' '.join(pts)}"]
        lines += [f"a=rtpmap:{pt} {name}/8000" for name, pt in formats]
        if dtmf is not None:
            lines += [f"a=rtpmap:{dtmf} telephone-event/8000", f"a=fmtp:{dtmf} 0-15"]
        return lines + ["a=ptime:20", f"a={direction}"]

    def _body(self, media_lines: list[str]) -> str:
        ipv = "IP6" if ":" in self.ip else "IP4"
        rest = "\r\n".join(["s=voice-agent", f"c=IN {ipv} {self.ip}", "t=0 0", *media_lines])
        if self._last_body is not None and rest != self._last_body:
            self._version += 1  # RFC 3264 section 8: a changed description gets a higher version
        self._last_body = rest
        origin = f"o=voice-agent {self._session_id} {self._version} IN {ipv} {self.ip}"
        return f"v=0\r\n{origin}\r\n{rest}\r\n"

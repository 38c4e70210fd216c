"""SIP messages (RFC 3261 section 7): parse, inspect and serialise requests and responses.

Parsing is two-level. Bytes that are not a SIP message at all (no start line, not text)
raise `SipParseError` and are dropped. A message whose start line and headers parse but
which is otherwise broken (bad Content-Length, truncated body) comes back with `problem`
set, so the server can still answer 400 to the address in its Via.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_MESSAGE = 65_535
MAX_HEADERS = 256
MAX_LINE = 8_192

COMPACT = {
    "i": "Call-ID", "m": "Contact", "e": "Content-Encoding", "l": "Content-Length", "c": "Content-Type",
    "f": "From", "s": "Subject", "k": "Supported", "t": "To", "v": "Via", "o": "Event", "r": "Refer-To",
}  # fmt: skip
_KNOWN = [
    "Via", "From", "To", "Call-ID", "CSeq", "Contact", "Max-Forwards", "Content-Length", "Content-Type",
    "Route", "Record-Route", "Authorization", "WWW-Authenticate", "Require", "Proxy-Require", "Supported",
    "Unsupported", "Allow", "Accept", "User-Agent", "Server", "Expires", "Subject", "Retry-After", "Warning",
    "Reason", "Content-Encoding", "Event",
]  # fmt: skip
CANONICAL = {name.lower(): name for name in _KNOWN}
# Headers whose comma-separated values are separate entries (RFC 3261 section 7.3.1).
LIST_HEADERS = {"Via", "Route", "Record-Route", "Contact", "Require", "Proxy-Require", "Supported", "Allow"}

REASONS = {
    100: "Trying", 180: "Ringing", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 413: "Request Entity Too Large",
    415: "Unsupported Media Type", 416: "Unsupported URI Scheme", 420: "Bad Extension",
    481: "Call/Transaction Does Not Exist", 482: "Loop Detected", 483: "Too Many Hops", 486: "Busy Here",
    487: "Request Terminated", 488: "Not Acceptable Here", 491: "Request Pending", 500: "Server Internal Error",
    503: "Service Unavailable", 505: "Version Not Supported",
}  # fmt: skip

_TOKEN = re.compile(r"^[A-Za-z0-9.!%*_+`'~-]+$")


class SipParseError(ValueError):
    """Not a SIP message; dropped without an answer."""


def canonical(name: str) -> str:
    name = name.strip()
    low = name.lower()
    if low in COMPACT:
        return COMPACT[low]
    return CANONICAL.get(low, name)


@dataclass
class SipMessage:
    method: str | None = None  # requests
    uri: str = ""
    status: int = 0  # responses
    reason: str = ""
    version: str = "SIP/2.0"
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    problem: str | None = None  # recoverable defect: answer 400 with this reason

    @property
    def is_request(self) -> bool:
        return self.method is not None

    def get(self, name: str) -> str | None:
        name = canonical(name)
        for n, v in self.headers:
            if n == name:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        """Every value of a header, with list headers split at top-level commas."""
        name = canonical(name)
        out: list[str] = []
        for n, v in self.headers:
            if n == name:
                out.extend(split_list(v) if name in LIST_HEADERS else [v])
        return out

    def add(self, name: str, value: str) -> None:
        self.headers.append((canonical(name), value))

    def to_bytes(self) -> bytes:
        if self.is_request:
            start = f"{self.method} {self.uri} SIP/2.0"
        else:
            start = f"SIP/2.0 {self.status} {self.reason or REASONS.get(self.status, 'Unknown')}"
        lines = [start] + [f"{n}: {v}" for n, v in self.headers if n != "Content-Length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


def parse(data: bytes) -> SipMessage:
    if len(data) > MAX_MESSAGE:
        raise SipParseError(f"datagram of {len(data)} bytes is larger than a SIP message may be")
    data = data.lstrip(b"\r\n")
    if not data:
        raise SipParseError("keep-alive or empty datagram")
    end = data.find(b"\r\n\r\n")
    sep = 4
    if end < 0:
        end, sep = data.find(b"\n\n"), 2
    head_bytes, rest = (data, b"") if end < 0 else (data[:end], data[end + sep :])
    try:
        head = head_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError("header section is not UTF-8 text") from None
    lines = head.replace("\r\n", "\n").split("\n")
    msg = _start_line(lines[0])
    for line in lines[1:]:
        if not line:
            continue  # only possible at the end of a datagram cut before its blank line
        if len(line) > MAX_LINE:
            raise SipParseError("header line too long")
        if line[:1] in (" ", "\t"):
            if not msg.headers:
                raise SipParseError("continuation line before any header")
            n, v = msg.headers[-1]
            msg.headers[-1] = (n, f"{v} {line.strip()}")  # RFC 3261 7.3.1: folding is one space
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name.strip()):
            msg.problem = msg.problem or f"malformed header line {line[:40]!r}"
            continue
        if len(msg.headers) >= MAX_HEADERS:
            raise SipParseError("too many headers")
        msg.headers.append((canonical(name), value.strip()))
    if end < 0:
        msg.problem = msg.problem or "message has no end of headers (truncated?)"
    _body(msg, rest)
    return msg


def _start_line(line: str) -> SipMessage:
    if len(line) > MAX_LINE:
        raise SipParseError("start line too long")
    parts = line.split(" ", 2)
    if len(parts) != 3:
        raise SipParseError(f"malformed start line {line[:60]!r}")
    if parts[0].upper().startswith("SIP/"):
        if not parts[1].isdigit() or not 100 <= int(parts[1]) <= 699:
            raise SipParseError(f"bad status code {parts[1][:10]!r}")
        return SipMessage(status=int(parts[1]), reason=parts[2], version=parts[0].upper())
    method, uri, version = parts
    if not _TOKEN.match(method) or not uri or " " in version or not version.upper().startswith("SIP/"):
        raise SipParseError(f"malformed request line {line[:60]!r}")
    return SipMessage(method=method.upper(), uri=uri, version=version.upper())


def _body(msg: SipMessage, rest: bytes) -> None:
    values = [v for n, v in msg.headers if n == "Content-Length"]
    if not values:
        msg.body = rest  # allowed over UDP (RFC 3261 18.3): the body is the rest of the datagram
        return
    text = values[0].strip()
    if len(values) > 1 or not text.isdigit() or len(text) > 6:
        msg.problem = msg.problem or f"bad Content-Length {values[0][:20]!r}"
        msg.body = rest
        return
    length = int(text)
    if length > len(rest):
        msg.problem = msg.problem or f"body truncated: Content-Length {length}, got {len(rest)} bytes"
        msg.body = rest
        return
    msg.body = rest[:length]


def split_list(value: str) -> list[str]:
    """Split at commas outside quotes and angle brackets."""
    out, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(value):
        ch = value[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            out.append(value[start:i].strip())
            start = i + 1
        i += 1
    out.append(value[start:].strip())
    return [v for v in out if v]


def parse_params(text: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for part in text.split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            params[name.lower()] = value.strip().strip('"')
    return params


@dataclass(frozen=True)
class Via:
    transport: str
    host: str
    port: int | None
    params: dict[str, str]

    @property
    def branch(self) -> str | None:
        return self.params.get("branch")


def parse_via(value: str) -> Via:
    proto, _, rest = value.strip().partition(" ")
    bits = [b.strip() for b in proto.split("/")]
    if len(bits) != 3 or bits[0].upper() != "SIP" or not rest.strip():
        raise ValueError(f"malformed Via {value[:60]!r}")
    sent_by, _, params = rest.strip().partition(";")
    host, port = split_host_port(sent_by.strip())
    return Via(bits[2].upper(), host, port, parse_params(params))


def split_host_port(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, _, tail = text[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = text.partition(":")
    if not host or any(c in host for c in " <>;,\"") or (port_text and not port_text.isdigit()):
        raise ValueError(f"bad host:port {text[:60]!r}")
    port = int(port_text) if port_text else None
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port out of range in {text[:60]!r}")
    return host, port


@dataclass(frozen=True)
class NameAddr:
    """From, To, Contact, Route: an optional display name, a URI and header parameters."""

    uri: str
    params: dict[str, str]
    raw: str

    @property
    def tag(self) -> str | None:
        return self.params.get("tag")


def parse_name_addr(value: str) -> NameAddr:
    value = value.strip()
    if "<" in value:
        lt = value.index("<")
        gt = value.find(">", lt)
        if gt < 0:
            raise ValueError(f"unterminated <uri> in {value[:60]!r}")
        uri, params = value[lt + 1 : gt], value[gt + 1 :]
    else:
        uri, _, params = value.partition(";")  # addr-spec: parameters after it belong to the header
        params = ";" + params if params else ""
    if ":" not in uri:
        raise ValueError(f"not a URI: {uri[:60]!r}")
    return NameAddr(uri.strip(), parse_params(params.lstrip(";")) if params else {}, value)


@dataclass(frozen=True)
class SipUri:
    scheme: str
    user: str | None
    host: str
    port: int | None
    params: dict[str, str]


def parse_uri(uri: str) -> SipUri:
    scheme, colon, rest = uri.partition(":")
    if not colon or scheme.lower() not in ("sip", "sips"):
        raise ValueError(f"unsupported URI scheme in {uri[:60]!r}")
    rest = rest.split("?", 1)[0]
    hostport, _, params = rest.partition(";")
    user = None
    if "@" in hostport:
        user, _, hostport = hostport.rpartition("@")
    host, port = split_host_port(hostport)
    return SipUri(scheme.lower(), user, host, port, parse_params(params))


def parse_cseq(value: str) -> tuple[int, str]:
    num, _, method = value.strip().partition(" ")
    method = method.strip().upper()
    if not num.isdigit() or len(num) > 10 or int(num) >= 2**31 or not _TOKEN.match(method or "-"):
        raise ValueError(f"bad CSeq {value[:40]!r}")
    return int(num), method


def response(request: SipMessage, status: int, to_tag: str | None = None, reason: str | None = None) -> SipMessage:
    """A response carrying the request's Via, From, To (tagged), Call-ID and CSeq (RFC 3261 8.2.6.2)."""
    msg = SipMessage(status=status, reason=reason or REASONS.get(status, "Unknown"))
    for name in ("Via", "From", "To", "Call-ID", "CSeq"):
        for n, v in request.headers:
            if n != name:
                continue
            if name == "To" and to_tag and "tag=" not in v.lower():
                v = f"{v};tag={to_tag}"
            msg.headers.append((n, v))
    return msg


def sipfrag_status(body: str) -> int | None:
    """The status code of a ``message/sipfrag`` body's first line ("SIP/2.0 200 OK"), as a
    REFER's NOTIFY carries it (RFC 3515 2.4.5); None when it is not a status line."""
    first = body.strip().split("\n", 1)[0].strip().split()
    if len(first) >= 2 and first[0].upper() == "SIP/2.0" and first[1].isdigit() and len(first[1]) == 3:
        return int(first[1])
    return None

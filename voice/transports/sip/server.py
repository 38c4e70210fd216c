"""The SIP user agent server: one UDP socket, request validation, and routing to calls.

Every datagram is handled inside `datagram_received` under a catch-all, so a malformed
message or a bug triggered by one caller is logged and counted but never stops the socket
or touches other calls. Responses go back to the address the request came from (symmetric
signalling, RFC 3581), which is what works behind NAT.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import secrets
import socket
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

from voice.transports.base import Clock, Refusal

from . import sdp
from .call import ALLOW, CallRecord, SessionFactory, SipCall
from .config import SipConfig
from .digest import DigestAuth
from .media import CallMedia, PortPool
from .message import (
    SipMessage,
    SipParseError,
    parse,
    parse_cseq,
    parse_name_addr,
    parse_uri,
    parse_via,
    response,
    split_list,
)
from .transaction import Addr, ServerTransaction, Timers, TransactionLayer

log = logging.getLogger("voice.sip")
USER_AGENT = "voice-agent/0.1"
_CALL_ID = re.compile(r"^[\x21-\x7e]{1,256}$")
Headers = tuple[tuple[str, str], ...]


class SipServer(asyncio.DatagramProtocol):
    def __init__(
        self,
        agent: SessionFactory,
        config: SipConfig | None = None,
        timers: Timers | None = None,
        reports_dir: str | Path | None = None,
    ) -> None:
        self.agent = agent
        self.config = config or SipConfig()
        self.timers = timers or Timers()
        self.reports_dir = reports_dir
        self.user_agent = USER_AGENT
        self.networks = [ipaddress.ip_network(c, strict=False) for c in self.config.allow]
        self.auth = None
        if self.config.auth_user and self.config.auth_password:
            self.auth = DigestAuth(self.config.auth_user, self.config.auth_password, self.config.realm)
        self.ports = PortPool(*self.config.rtp_ports)
        self.txns = TransactionLayer(self.send, self.timers)
        self.calls: dict[tuple[str, str], SipCall] = {}
        self.finished: deque[CallRecord] = deque(maxlen=200)
        self.counters: Counter[str] = Counter()
        self.listeners: list[Callable[[CallRecord], None]] = []
        self._by_invite: dict[tuple[str, str], SipCall] = {}  # (Call-ID, From tag): for CANCEL and merged INVITEs
        self._tasks: dict[SipCall, asyncio.Task[None]] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self._closing = False
        self.host, self.port = "", 0

    # --- lifecycle ---

    async def start(self) -> tuple[str, int]:
        host, _, port = self.config.bind.rpartition(":")  # port 0: any free port (tests)
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(host.strip("[]"), int(port)))
        self.host, self.port = self._transport.get_extra_info("sockname")[:2]
        return self.host, self.port

    async def close(self) -> None:
        """Hang up every call (BYE), wait for their reports, then close the socket."""
        self._closing = True
        for call in list(self.calls.values()):
            call.hang_up("shutdown")
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        self.txns.close()
        if self._transport is not None:
            self._transport.close()

    @property
    def active_calls(self) -> int:
        return len(self.calls)

    def call_finished(self, call: SipCall, record: CallRecord) -> None:
        self.calls.pop(call.key, None)
        if self._by_invite.get((call.call_id, call.remote_tag)) is call:
            del self._by_invite[(call.call_id, call.remote_tag)]
        self.finished.append(record)
        for fn in self.listeners:
            try:
                fn(record)
            except Exception:
                log.exception("call-end listener failed")

    # --- plumbing used by calls ---

    def send(self, data: bytes, addr: Addr) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        try:
            self._transport.sendto(data, addr)
        except OSError as exc:
            log.debug("send to %s failed: %s", addr, exc)

    def allowed(self, ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip.split("%")[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr in net for net in self.networks)

    def local_ip_for(self, peer_ip: str) -> str:
        """The address to put in SDP and Contact for this caller."""
        if self.config.public_address:
            return self.config.public_address
        if not ipaddress.ip_address(self.host).is_unspecified:
            return self.host
        family = socket.AF_INET6 if ":" in peer_ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:  # connect() on UDP only picks a route
            s.connect((peer_ip, 9))
            return s.getsockname()[0]

    def contact_for(self, local_ip: str) -> str:
        host = f"[{local_ip}]" if ":" in local_ip else local_ip
        return f"{host}:{self.port}"

    def new_media(self, ip: str, clock: Clock) -> CallMedia:
        return CallMedia(ip, self.ports, self.allowed, clock, self.config.jitter_ms, self.config.jitter_min_ms)

    def make_response(
        self, req: SipMessage, status: int, source: Addr, to_tag: str | None = None, reason: str | None = None
    ) -> SipMessage:
        """A response to `req`, which came from `source`."""
        msg = response(req, status, to_tag or (secrets.token_hex(6) if status > 100 else None), reason)
        for i, (name, value) in enumerate(msg.headers):
            if name == "Via" and split_list(value):
                msg.headers[i] = (name, _stamp_via(value, source))
                break
        msg.add("Server", self.user_agent)
        return msg

    # --- datagrams ---

    def datagram_received(self, data: bytes, addr: Addr) -> None:  # type: ignore[override]
        try:
            msg = parse(data)
        except SipParseError as exc:
            self.counters["dropped"] += 1
            log.debug("dropped datagram from %s: %s", addr[0], exc)
            return
        try:
            if msg.is_request:
                self.counters["requests"] += 1
                self._on_request(msg, addr)
            else:
                self.counters["responses"] += 1
                self.txns.response(msg)
        except Exception:
            self.counters["errors"] += 1
            log.exception("error handling a message from %s", addr[0])

    def error_received(self, exc: Exception) -> None:
        log.debug("socket error: %s", exc)  # ICMP unreachable from a gone peer; nothing to do

    def _reply(self, req: SipMessage, addr: Addr, status: int, reason: str | None = None, extra: Headers = ()) -> None:
        """A stateless answer, for requests rejected before any transaction exists."""
        if req.method == "ACK":
            return
        self.counters[f"sent_{status}"] += 1
        msg = self.make_response(req, status, addr, reason=reason)
        for name, value in extra:
            msg.add(name, value)
        self.send(msg.to_bytes(), addr)

    def _respond(self, txn: ServerTransaction, status: int, reason: str | None = None, extra: Headers = ()) -> None:
        msg = self.make_response(txn.request, status, txn.addr, reason=reason)
        for name, value in extra:
            msg.add(name, value)
        self.counters[f"sent_{status}"] += 1
        self.txns.respond(txn, msg)

    def _on_request(self, req: SipMessage, addr: Addr) -> None:
        try:
            parse_via(req.get_all("Via")[0])
        except (IndexError, ValueError):
            self.counters["dropped"] += 1  # no usable Via: there is nowhere to send an answer
            return
        if not self.allowed(addr[0]):
            self.counters["forbidden"] += 1
            log.warning("rejected %s from %s: source not allowed", req.method, addr[0])
            self._reply(req, addr, 403, "Source Not Allowed")
            return
        problem = _validate(req)
        if problem is not None:
            self._reply(req, addr, *problem)
            return
        required = [r for v in req.get_all("Require") for r in split_list(v)]
        if required and req.method not in ("ACK", "CANCEL"):
            # We implement no SIP extensions (no 100rel, no timers): refuse rather than half-support.
            self._reply(req, addr, 420, extra=(("Unsupported", ", ".join(required)[:200]),))
            return
        if req.method == "ACK":
            self._on_ack(req)
            return
        txn = self.txns.lookup(req)
        if txn is not None:
            self.counters["retransmissions"] += 1
            self.txns.retransmission(txn)
            return
        txn = self.txns.create(req, addr)
        if req.method == "CANCEL":
            self._on_cancel(req, txn)
            return
        to_tag = parse_name_addr(req.get("To") or "").tag
        if to_tag:
            call = self.calls.get((req.get("Call-ID") or "", to_tag))
            if call is None:
                self._respond(txn, 481)
            else:
                call.on_request(req, txn)
        elif req.method == "INVITE":
            self._on_invite(req, addr, txn)
        elif req.method == "OPTIONS":
            self._respond(txn, 200, extra=(("Allow", ALLOW), ("Accept", "application/sdp")))
        elif req.method in ("BYE", "INFO", "NOTIFY"):
            self._respond(txn, 481)
        else:
            self._respond(txn, 405, extra=(("Allow", ALLOW),))

    def _on_ack(self, ack: SipMessage) -> None:
        txn = self.txns.lookup(ack)
        if txn is not None and txn.final_status >= 300:
            self.txns.ack(txn)  # the ACK of a rejection belongs to the INVITE transaction
            return
        to_tag = parse_name_addr(ack.get("To") or "").tag
        call = self.calls.get((ack.get("Call-ID") or "", to_tag or ""))
        if call is not None:
            call.on_ack(ack)

    def _on_cancel(self, cancel: SipMessage, txn: ServerTransaction) -> None:
        invite_key = (txn.key[0], txn.key[1], "INVITE")  # RFC 3261 9.2: same branch as the INVITE
        invite_txn = self.txns.server.get(invite_key)
        if invite_txn is None:
            self._respond(txn, 481)
            return
        self._respond(txn, 200)
        for call in self._tasks:
            if call.txn is invite_txn:
                call.on_cancel()
                break

    def _on_invite(self, req: SipMessage, addr: Addr, txn: ServerTransaction) -> None:
        self._respond(txn, 100)
        if self._closing:
            self._respond(txn, 503, "Shutting Down")
            return
        offer = None
        if req.body.strip():
            ctype = (req.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "application/sdp" or req.get("Content-Encoding"):
                self._respond(txn, 415, extra=(("Accept", "application/sdp"),))
                return
            try:
                offer = sdp.parse(req.body.decode("utf-8"))
                sdp.LocalSdp("127.0.0.1", 0, tuple(self.config.codecs)).answer(offer)  # 488 before any work
            except (sdp.SdpError, UnicodeDecodeError) as exc:
                self._respond(txn, 400, _status_text(f"Bad SDP: {exc}"))
                return
            except sdp.NotAcceptable as exc:
                self._respond(txn, 488, extra=(("Warning", f'304 voice-agent "{_status_text(str(exc))}"'),))
                return
        if self.auth is not None:
            result = self.auth.check("INVITE", req.get("Authorization"))
            if not result.ok:
                self.counters["auth_challenges"] += 1
                self._respond(txn, 401, extra=(("WWW-Authenticate", self.auth.challenge(result.stale)),))
                return
        contacts = req.get_all("Contact")
        try:
            if contacts:
                parse_uri(parse_name_addr(contacts[0]).uri)  # where our BYE would go
        except ValueError:
            self._respond(txn, 400, "Bad Contact")
            return
        from_tag = parse_name_addr(req.get("From") or "").tag or ""
        if (req.get("Call-ID") or "", from_tag) in self._by_invite:
            self._respond(txn, 482)  # a second INVITE for a dialog being set up (RFC 3261 8.2.2.2)
            return
        if self.config.max_calls is not None and self.active_calls >= self.config.max_calls:
            self.counters["busy"] += 1
            log.info("busy: %d calls in progress, rejecting a call from %s", self.active_calls, addr[0])
            self._respond(txn, 486)
            return
        seat = None
        admit = getattr(self.agent, "admit", None)  # the agent's capacity, shared with its other transports
        if admit is not None:
            decision = admit("sip")
            if isinstance(decision, Refusal):
                self._refuse(txn, decision, addr)
                return
            seat = decision
        call = SipCall(self, req, addr, txn, offer, seat)
        self.calls[call.key] = call
        self._by_invite[(call.call_id, call.remote_tag)] = call
        task = asyncio.get_running_loop().create_task(call.run(), name=f"sip-call-{call.session_id}")
        self._tasks[call] = task
        task.add_done_callback(lambda _t, c=call: self._call_done(c))

    def _call_done(self, call: SipCall) -> None:
        self._tasks.pop(call, None)
        if call.seat is not None:
            call.seat.release()  # also when the call ended before it had a session (CANCEL, failure)

    def _refuse(self, txn: ServerTransaction, refusal: Refusal, addr: Addr) -> None:
        retry = (("Retry-After", str(refusal.retry_after_s)),)
        log.info("refusing a call from %s: %s", addr[0], refusal.detail)
        if refusal.busy:
            self.counters["busy"] += 1
            self._respond(txn, 486, extra=retry)
        else:
            self.counters["overloaded"] += 1
            self._respond(txn, 503, "Service Unavailable", extra=retry)


def _validate(req: SipMessage) -> tuple[int, str] | None:
    """(status, reason) for a request we must reject before looking at its method."""
    if req.problem:
        return 400, _status_text(req.problem)
    if req.version != "SIP/2.0":
        return 505, "Version Not Supported"
    for name in ("From", "To", "Call-ID", "CSeq"):
        values = [v for n, v in req.headers if n == name]
        if len(values) != 1:
            return 400, f"{'Missing' if not values else 'Repeated'} {name} Header"
    try:
        parse_name_addr(req.get("From") or "")
        parse_name_addr(req.get("To") or "")
    except ValueError:
        return 400, "Bad From Or To Header"
    if not _CALL_ID.match(req.get("Call-ID") or ""):
        return 400, "Bad Call-ID"
    try:
        _, method = parse_cseq(req.get("CSeq") or "")
    except ValueError:
        return 400, "Bad CSeq"
    if method != req.method:
        return 400, "CSeq Method Does Not Match"
    forwards = req.get("Max-Forwards")
    if forwards is not None:
        if not forwards.isdigit() or len(forwards) > 3:
            return 400, "Bad Max-Forwards"
        if int(forwards) == 0 and req.method not in ("ACK", "CANCEL"):
            return 483, "Too Many Hops"
    try:
        parse_uri(req.uri)
    except ValueError:
        scheme = req.uri.partition(":")[0].lower()
        return (400, "Bad Request-URI") if scheme in ("sip", "sips") else (416, "Unsupported URI Scheme")
    return None


def _stamp_via(value: str, source: Addr) -> str:
    """Add received= and fill rport= on the top Via (RFC 3261 18.2.1, RFC 3581)."""
    vias = split_list(value)
    top = vias[0]
    ip, port = str(source[0]), int(source[1])
    if re.search(r";\s*rport(?=\s*;|\s*$)", top):
        top = re.sub(r";\s*rport(?=\s*;|\s*$)", f";rport={port}", top)
        if ";received=" not in top:
            top += f";received={ip}"
    else:
        try:
            via = parse_via(top)
            if via.host != ip and ";received=" not in top:
                top += f";received={ip}"
        except ValueError:
            pass
    return ", ".join([top, *vias[1:]])


def _status_text(text: str) -> str:
    return "".join(ch if ch.isprintable() and ch not in "\r\n" else "?" for ch in text)[:80]

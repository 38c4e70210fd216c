"""SIP transactions over UDP (RFC 3261 section 17, with the RFC 6026 accepted state).

Server side: a retransmitted request is answered with the last response sent, a non-2xx
final answer to an INVITE is retransmitted (Timer G) until its ACK arrives or Timer H
fires, and finished transactions linger to absorb late retransmissions (Timers I and J).
Client side: only non-INVITE requests are ever sent (our BYE); they are retransmitted
(Timer E) until a final response or Timer F.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .message import SipMessage, parse_cseq, parse_via

Addr = tuple[Any, ...]
MAGIC = "z9hG4bK"


@dataclass(frozen=True)
class Timers:
    t1: float = 0.5  # RTT estimate
    t2: float = 4.0  # cap on retransmission interval
    t4: float = 5.0  # how long a message can live in the network

    @property
    def b(self) -> float:  # == F == H == J: give up after 64*T1
        return 64 * self.t1


def new_branch() -> str:
    return MAGIC + secrets.token_hex(8)


def transaction_key(msg: SipMessage) -> tuple[str, str, str]:
    """(branch, sent-by, method) of the top Via; ACK maps to its INVITE (RFC 3261 17.2.3)."""
    via = parse_via(msg.get_all("Via")[0])
    method = "INVITE" if msg.method == "ACK" else (msg.method or parse_cseq(msg.get("CSeq") or "")[1])
    branch = via.branch or ""
    if not branch.startswith(MAGIC):
        # An RFC 2543 peer: no usable branch, so identify the request by what it carries.
        num = parse_cseq(msg.get("CSeq") or "")[0]
        branch = f"2543:{msg.get('Call-ID')}:{num}:{msg.get('From')}"
    return branch, f"{via.host}:{via.port}", method


@dataclass
class ServerTransaction:
    key: tuple[str, str, str]
    request: SipMessage
    addr: Addr
    last_response: bytes | None = None
    final_status: int = 0
    acked: bool = False
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)

    def cancel_timers(self) -> None:
        for h in self._timers:
            h.cancel()
        self._timers.clear()


class TransactionLayer:
    def __init__(self, send: Callable[[bytes, Addr], None], timers: Timers) -> None:
        self.send = send
        self.timers = timers
        self.server: dict[tuple[str, str, str], ServerTransaction] = {}
        self._client: dict[str, asyncio.Future[SipMessage]] = {}

    # --- server transactions ---

    def lookup(self, request: SipMessage) -> ServerTransaction | None:
        return self.server.get(transaction_key(request))

    def create(self, request: SipMessage, addr: Addr) -> ServerTransaction:
        txn = ServerTransaction(transaction_key(request), request, addr)
        self.server[txn.key] = txn
        return txn

    def retransmission(self, txn: ServerTransaction) -> None:
        """The same request again: repeat whatever we last said."""
        if txn.last_response is not None:
            self.send(txn.last_response, txn.addr)

    def respond(self, txn: ServerTransaction, response: SipMessage) -> None:
        data = response.to_bytes()
        self.send(data, txn.addr)
        txn.last_response = data
        if response.status < 200 or txn.final_status:
            return
        txn.final_status = response.status
        loop = asyncio.get_running_loop()
        is_invite = txn.request.method == "INVITE"
        if is_invite and response.status >= 300:
            txn._timers.append(loop.call_later(self.timers.t1, self._timer_g, txn, self.timers.t1))
            txn._timers.append(loop.call_later(self.timers.b, self._drop, txn))  # Timer H
        else:
            # Timer J (non-INVITE) or the RFC 6026 accepted state (INVITE 2xx; the dialog retransmits).
            txn._timers.append(loop.call_later(self.timers.b, self._drop, txn))

    def ack(self, txn: ServerTransaction) -> None:
        if txn.acked:
            return
        txn.acked = True
        if txn.final_status >= 300:
            txn.cancel_timers()
            txn._timers.append(asyncio.get_running_loop().call_later(self.timers.t4, self._drop, txn))  # Timer I

    def _timer_g(self, txn: ServerTransaction, interval: float) -> None:
        if txn.acked or txn.key not in self.server or txn.last_response is None:
            return
        self.send(txn.last_response, txn.addr)
        nxt = min(2 * interval, self.timers.t2)
        txn._timers.append(asyncio.get_running_loop().call_later(nxt, self._timer_g, txn, nxt))

    def _drop(self, txn: ServerTransaction) -> None:
        txn.cancel_timers()
        if self.server.get(txn.key) is txn:
            del self.server[txn.key]

    # --- client transactions ---

    async def request(self, msg: SipMessage, addr: Addr) -> SipMessage | None:
        """Send a non-INVITE request reliably; the final response, or None after Timer F."""
        branch = parse_via(msg.get_all("Via")[0]).branch or ""
        fut: asyncio.Future[SipMessage] = asyncio.get_running_loop().create_future()
        self._client[branch] = fut
        data = msg.to_bytes()
        interval = self.timers.t1
        deadline = asyncio.get_running_loop().time() + self.timers.b
        try:
            while True:
                self.send(data, addr)
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return None
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), min(interval, remaining))
                except TimeoutError:
                    interval = min(2 * interval, self.timers.t2)
        finally:
            self._client.pop(branch, None)

    def response(self, msg: SipMessage) -> bool:
        """Route a response to the client transaction waiting for it."""
        try:
            branch = parse_via(msg.get_all("Via")[0]).branch or ""
        except (IndexError, ValueError):
            return False
        fut = self._client.get(branch)
        if fut is None or fut.done() or msg.status < 200:
            return fut is not None
        fut.set_result(msg)
        return True

    def close(self) -> None:
        for txn in list(self.server.values()):
            txn.cancel_timers()
        self.server.clear()
        for fut in self._client.values():
            if not fut.done():
                fut.cancel()

"""One phone call: the SIP dialog (RFC 3261 sections 12-15) and its call session.

The call owns the INVITE's server transaction until it is answered, retransmits its 2xx
until the ACK arrives (13.3.1.4), handles in-dialog requests (re-INVITE for hold, INFO
DTMF, OPTIONS, BYE, the NOTIFYs of a transfer), transfers the call with a REFER when the session
asks (RFC 3515), and ends the dialog from our side with a BYE when the agent hangs up, the call
has been transferred, the caller's RTP stops, or the server shuts down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from voice.transports.base import AudioOutput, Clock, RealtimeClock

from . import sdp
from .config import SipConfig
from .dtmf import DtmfError, parse_info_body
from .media import CallMedia
from .message import SipMessage, parse_cseq, parse_name_addr, parse_uri, sipfrag_status
from .sdp import LocalSdp, MediaPlan
from .transaction import Addr, ServerTransaction, Timers, TransactionLayer, new_branch

log = logging.getLogger("voice.sip")
ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY"


class CallState(Enum):
    RINGING = "ringing"
    ANSWERED = "answered"  # 2xx sent, ACK not yet received
    CONFIRMED = "confirmed"
    ENDED = "ended"


@dataclass
class CallRecord:
    """What the server remembers about a finished call."""

    call_id: str
    session_id: str
    remote: str
    caller: str
    codec: str | None
    started_at: float
    answered_at: float | None
    duration_s: float
    reason: str
    media: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] | None = None


class SessionFactory(Protocol):
    """`pipelines.agent.Agent` or anything that makes call sessions the same way."""

    def new_session(self, output: AudioOutput, clock: Clock, transport: str, session_id: str | None = None) -> Any: ...


class CallHost(Protocol):
    """What a call needs from the server that routes its requests (`SipServer`)."""

    agent: SessionFactory
    config: SipConfig
    timers: Timers
    txns: TransactionLayer
    reports_dir: str | Path | None
    user_agent: str

    def send(self, data: bytes, addr: Addr) -> None: ...

    def local_ip_for(self, peer_ip: str) -> str: ...

    def contact_for(self, local_ip: str) -> str: ...

    def new_media(self, ip: str, clock: Clock) -> CallMedia: ...

    def make_response(
        self, req: SipMessage, status: int, source: Addr, to_tag: str | None = None, reason: str | None = None
    ) -> SipMessage: ...

    def call_finished(self, call: SipCall, record: CallRecord) -> None: ...


class SipCall:
    def __init__(
        self, server: CallHost, invite: SipMessage, addr: Addr, txn: ServerTransaction, offer: sdp.Session | None,
        seat: Any = None,
    ) -> None:
        self.server = server
        self.seat = seat  # the agent's admission of this call (has .release()); the server gives it back
        self.invite = invite
        self.addr = addr
        self.txn = txn
        self.offer = offer  # None: the INVITE had no SDP, so we offer in the 2xx and the ACK answers
        self.clock = RealtimeClock()
        self.local_ip = server.local_ip_for(addr[0])
        self.media = server.new_media(self.local_ip, self.clock)
        self.local_sdp = LocalSdp(self.local_ip, 0, tuple(server.config.codecs))
        self.call_id = invite.get("Call-ID") or ""
        self.local_tag = secrets.token_hex(6)
        caller = parse_name_addr(invite.get("From") or "")
        self.remote_tag = caller.tag or ""
        self.caller = caller.uri
        contacts = invite.get_all("Contact")
        self.remote_target = parse_name_addr(contacts[0]).uri if contacts else caller.uri
        self.route_set = invite.get_all("Record-Route")
        self.remote_cseq = parse_cseq(invite.get("CSeq") or "")[0]
        self.local_cseq = secrets.randbelow(10_000) + 1
        self.session_id = f"sip-{secrets.token_hex(6)}"
        self.state = CallState.RINGING
        self.plan: MediaPlan | None = None
        self.session: Any = None
        self.reason = "error"
        self.started_at = time.time()
        self.answered_at: float | None = None
        self._cancelled = asyncio.Event()
        self._bye = asyncio.Event()
        self._stop = asyncio.Event()  # server shutdown or a failed offer/answer
        self._stop_reason = "shutdown"
        self._no_ack = asyncio.Event()
        self._pending_ack: tuple[int, asyncio.Event, bool] | None = None  # (CSeq, acked, we offered)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._refer_outcome: asyncio.Future[int] | None = None  # the transfer target's final status

    @property
    def key(self) -> tuple[str, str]:
        return self.call_id, self.local_tag

    # --- lifecycle ---

    async def run(self) -> None:
        try:
            if await self._answer():
                await self._in_call()
        except Exception:
            log.exception("call %s failed", self.call_id)
            self.reason = "error"
            if self.state is CallState.RINGING and not self.txn.final_status:
                self._respond(self.txn, 500)
        finally:
            await self._teardown()

    async def _answer(self) -> bool:
        try:
            self.local_sdp.port = await self.media.bind()
        except OSError as exc:
            log.error("call %s: %s", self.call_id, exc)
            self._respond(self.txn, 503, reason="No Media Port Free")
            return False
        answer = None
        if self.offer is not None:
            answer = self.local_sdp.answer(self.offer)  # acceptability was checked before the call was created
            self.plan = answer[0]
        self._respond(self.txn, 180)
        delay = self.server.config.answer_delay_ms / 1000
        if delay > 0:
            try:
                await asyncio.wait_for(self._cancelled.wait(), delay)
            except TimeoutError:
                pass
        if self._cancelled.is_set():
            self.reason = "cancelled"
            return False
        admitted = {"seat": self.seat} if self.seat is not None else {}
        self.session = self.server.agent.new_session(
            output=self.media.output, clock=self.clock, transport="sip", session_id=self.session_id, **admitted
        )
        self.session.can_transfer = True  # `_transfer`: REFER
        await self.session.start()
        if self._cancelled.is_set():
            self.reason = "cancelled"
            return False
        body = answer[1] if answer else self.local_sdp.offer()
        ok = self._response(self.invite, 200, body)
        self.server.txns.respond(self.txn, ok)
        self.state = CallState.ANSWERED
        self.answered_at = time.time()
        self.media.receiver.last_packet = time.monotonic()
        if self.plan is not None:
            self.media.start(self.plan, self.session)
        log.info(
            "call %s from %s answered (%s, session %s)",
            self.call_id, self.addr[0], self.plan.codec.name if self.plan else "codec in ACK", self.session_id,
        )  # fmt: skip
        self._await_ack(ok, self.remote_cseq, offered=answer is None)
        return True

    async def _in_call(self) -> None:
        while True:
            reason = await self._until_end()
            if reason != "transfer":
                break
            if await self._transfer():  # else the transfer failed, and the call goes on
                reason = "transferred"
                break
        self.reason = self._stop_reason if reason == "stop" else reason
        if reason == "agent_hangup":
            # Let the goodbye play out before hanging up (bounded, in case the output is stuck).
            wait = min(10.0, self.media.output.busy_until() - self.clock.now())
            if wait > 0:
                await asyncio.sleep(wait)
        if not self._bye.is_set():
            await self._send_bye()

    async def _until_end(self) -> str:
        """Wait for what ends the call (or, ``transfer``, asks to hand it on); its name."""
        waits: dict[str, Any] = {
            "caller_hangup": self._bye.wait(),
            "no_ack": self._no_ack.wait(),
            "stop": self._stop.wait(),
            "rtp_timeout": self._watch_rtp(),
        }
        for name, attr in (("agent_hangup", "hangup_requested"), ("transfer", "transfer_requested")):
            event = getattr(self.session, attr, None)
            if isinstance(event, asyncio.Event):
                waits[name] = event.wait()
        tasks = {asyncio.create_task(coro): name for name, coro in waits.items()}
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        ended = {tasks[t] for t in done}
        if self._bye.is_set():
            # the caller's BYE came in the same loop turn as something else (a server shutdown
            # right after it): the caller hung up
            ended.add("caller_hangup")
        return next(name for name in waits if name in ended)  # in the order of ``waits``

    async def _transfer(self) -> bool:
        """Hand the call to the session's transfer target (`CallSession.request_transfer`)
        with a REFER (RFC 3515), and follow it through the caller's NOTIFYs: true once the
        transfer target answered (the BYE follows), false when the caller refused the REFER
        or the target did not answer (the call goes on); the session is told which."""
        to = self.session.transfer["to"]
        refer = self._request("REFER")
        refer.add("Refer-To", f"<{to}>")
        refer.add("Referred-By", f"<sip:voice-agent@{self.server.contact_for(self.local_ip)}>")
        refer.add("Contact", f"<sip:voice-agent@{self.server.contact_for(self.local_ip)}>")
        self._refer_outcome = asyncio.get_running_loop().create_future()
        try:
            reply = await asyncio.wait_for(self.server.txns.request(refer, self._bye_destination()), 5.0)
        except TimeoutError:
            reply = None
        if reply is None:
            result = "failed: no answer to REFER"
        elif not 200 <= reply.status < 300:
            result = f"refused: {reply.status} {reply.reason}".strip()
        else:
            result = await self._refer_result(self._refer_outcome)
        self._refer_outcome = None
        log.info("call %s: transfer to %s: %s", self.call_id, to, result)
        self.session.transfer_done(result)
        return result == "transferred"

    async def _watch_rtp(self) -> None:
        timeout = self.server.config.rtp_timeout_s
        while True:
            await asyncio.sleep(1.0)
            if timeout <= 0 or self.plan is None or self.plan.direction in ("sendonly", "inactive"):
                self.media.receiver.last_packet = time.monotonic()  # no media expected: nothing to time out
                continue
            if self.media.seconds_since_packet() > timeout:
                log.warning("call %s: no RTP for %.0f s, hanging up", self.call_id, timeout)
                return

    async def _teardown(self) -> None:
        self.state = CallState.ENDED
        for t in list(self._tasks):
            t.cancel()
        await self.media.close()
        report = None
        if self.session is not None:
            try:
                report = await self.session.close(reason=self.reason)
            except Exception:
                log.exception("call %s: closing the session failed", self.call_id)
        ended = time.time()
        record = CallRecord(
            call_id=self.call_id,
            session_id=self.session_id,
            remote=f"{self.addr[0]}:{self.addr[1]}",
            caller=self.caller,
            codec=self.plan.codec.name if self.plan else None,
            started_at=self.started_at,
            answered_at=self.answered_at,
            duration_s=round(ended - (self.answered_at or self.started_at), 3),
            reason=self.reason,
            media=self.media.stats(),
            report=report,
        )
        self.server.call_finished(self, record)
        self._write_report(record)
        rx, tx = record.media["rx"], record.media.get("tx", {})
        log.info(
            "call %s ended (%s) after %.1f s: rx %d packets, %d lost, %.1f s audio; tx %d packets; dtmf %r",
            self.call_id, self.reason, record.duration_s, rx["received"], rx["lost"], rx["seconds_received"],
            tx.get("packets", 0), record.media["dtmf"],
        )  # fmt: skip

    def _write_report(self, record: CallRecord) -> None:
        folder = self.server.reports_dir
        if folder is None:
            return
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder) / f"{self.session_id}.json"
            path.write_text(json.dumps(asdict(record), indent=2, default=str))
        except OSError as exc:
            log.error("call %s: could not write report: %s", self.call_id, exc)

    # --- requests from the caller ---

    def on_cancel(self) -> None:
        """CANCEL matched our INVITE (the server already answered the CANCEL itself)."""
        if self.state is CallState.RINGING and not self.txn.final_status:
            self._respond(self.txn, 487)
            self._cancelled.set()

    def on_ack(self, ack: SipMessage) -> None:
        try:
            cseq = parse_cseq(ack.get("CSeq") or "")[0]
        except ValueError:
            return
        pending = self._pending_ack
        if pending is None or pending[0] != cseq:
            return
        self._pending_ack = None
        pending[1].set()
        if self.state is CallState.ANSWERED:
            self.state = CallState.CONFIRMED
        if pending[2]:
            self._take_answer(ack)

    def _take_answer(self, ack: SipMessage) -> None:
        """Our offer went in the 2xx; the ACK carries the caller's answer (RFC 3264 delayed offer)."""
        try:
            plan = self.local_sdp.accept_answer(sdp.parse(ack.body.decode("utf-8", "replace")))
        except (sdp.SdpError, sdp.NotAcceptable) as exc:
            log.warning("call %s: unusable SDP answer in ACK (%s), hanging up", self.call_id, exc)
            self._stop_reason = "bad_answer"
            self._stop.set()
            return
        self._apply(plan)

    def on_request(self, req: SipMessage, txn: ServerTransaction) -> None:
        """An in-dialog request other than ACK and CANCEL."""
        cseq = parse_cseq(req.get("CSeq") or "")[0]
        if cseq <= self.remote_cseq:
            self._respond(txn, 500, reason="CSeq Out Of Order")
            return
        self.remote_cseq = cseq
        if req.method == "BYE":
            self._respond(txn, 200)
            self._bye.set()
            self.on_cancel()  # a caller may end an early dialog with BYE (RFC 3261 15): the INVITE gets 487
        elif req.method == "INVITE":
            self._reinvite(req, txn)
        elif req.method == "INFO":
            self._info(req, txn)
        elif req.method == "NOTIFY":
            self._notify(req, txn)
        elif req.method == "OPTIONS":
            self._respond(txn, 200, extra=(("Allow", ALLOW), ("Accept", "application/sdp")))
        else:
            self._respond(txn, 405, extra=(("Allow", ALLOW),))

    def _reinvite(self, req: SipMessage, txn: ServerTransaction) -> None:
        if self.state is CallState.RINGING or self._pending_ack is not None:
            # RFC 3261 14.2: an INVITE overlapping one still in progress.
            self._respond(txn, 500, extra=(("Retry-After", "1"),))
            return
        if req.body.strip():
            ctype = (req.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "application/sdp":
                self._respond(txn, 415, extra=(("Accept", "application/sdp"),))
                return
            try:
                plan, body = self.local_sdp.answer(sdp.parse(req.body.decode("utf-8", "replace")))
            except sdp.SdpError as exc:
                self._respond(txn, 400, reason=_reason(exc))
                return
            except sdp.NotAcceptable:
                self._respond(txn, 488)  # the call keeps its current media
                return
            ok = self._response(req, 200, body)
            self.server.txns.respond(txn, ok)
            self._apply(plan)
            self._await_ack(ok, self.remote_cseq, offered=False)
        else:
            ok = self._response(req, 200, self.local_sdp.offer())
            self.server.txns.respond(txn, ok)
            self._await_ack(ok, self.remote_cseq, offered=True)

    def _info(self, req: SipMessage, txn: ServerTransaction) -> None:
        if not req.body.strip():
            self._respond(txn, 200)  # an empty INFO is a keep-alive probe
            return
        try:
            digit = parse_info_body(req.get("Content-Type") or "", req.body.decode("utf-8", "replace"))
        except DtmfError as exc:
            status = 415 if "content type" in str(exc) else 400
            self._respond(txn, status, reason=None if status == 415 else _reason(exc))
            return
        self._respond(txn, 200)
        self.media.receiver.digits.append(digit)
        if self.session is not None:
            self.session.push_dtmf(digit.digit, digit.duration_ms)

    async def _refer_result(self, outcome: asyncio.Future[int]) -> str:
        """Wait for the transfer target's final answer in a NOTIFY; a caller who hangs up (or a
        server that stops) meanwhile ends the wait at once."""
        timeout = self.server.config.transfer_timeout_s
        ended = [asyncio.ensure_future(self._bye.wait()), asyncio.ensure_future(self._stop.wait())]
        try:
            await asyncio.wait([outcome, *ended], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in ended:
                task.cancel()
        if outcome.done():
            status = outcome.result()
            return "transferred" if 200 <= status < 300 else f"failed: {status}"
        if self._bye.is_set() or self._stop.is_set():
            return "failed: the call ended before the target answered"
        return f"failed: no final NOTIFY in {timeout:.0f} s"

    def _notify(self, req: SipMessage, txn: ServerTransaction) -> None:
        """The progress of our REFER (RFC 3515 2.4.4): a sipfrag whose status line is the
        transfer target's answer; a final one settles `_transfer`."""
        if (req.get("Event") or "").split(";")[0].strip().lower() != "refer":
            self._respond(txn, 489, extra=(("Allow-Events", "refer"),))  # RFC 6665: Bad Event
            return
        self._respond(txn, 200)
        status = sipfrag_status(req.body.decode("utf-8", "replace"))
        outcome = self._refer_outcome
        if status is not None and status >= 200 and outcome is not None and not outcome.done():
            outcome.set_result(status)

    def _apply(self, plan: MediaPlan) -> None:
        was = self.plan
        self.plan = plan
        if self.session is None:
            return
        if self.media.sender is None:
            self.media.start(plan, self.session)
        else:
            self.media.update(plan)
        if was is not None and was.on_hold != plan.on_hold:
            log.info("call %s %s", self.call_id, "on hold" if plan.on_hold else "resumed")

    def hang_up(self, reason: str = "shutdown") -> None:
        """End the call from our side (server shutdown)."""
        self._stop_reason = reason
        if self.state is CallState.RINGING and not self.txn.final_status:
            self._respond(self.txn, 503 if reason == "shutdown" else 480)
            self._cancelled.set()
        self._stop.set()

    # --- sending ---

    def _await_ack(self, ok: SipMessage, cseq: int, offered: bool) -> None:
        acked = asyncio.Event()
        self._pending_ack = (cseq, acked, offered)
        task = asyncio.create_task(self._retransmit_2xx(ok.to_bytes(), acked))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _retransmit_2xx(self, data: bytes, acked: asyncio.Event) -> None:
        timers = self.server.timers
        interval, waited = timers.t1, 0.0
        while waited < timers.b:
            try:
                await asyncio.wait_for(acked.wait(), interval)
                return
            except TimeoutError:
                waited += interval
                self.server.send(data, self.addr)
                interval = min(2 * interval, timers.t2)
        log.warning("call %s: no ACK for our 200 OK after %.0f s", self.call_id, timers.b)
        self._pending_ack = None
        self._no_ack.set()

    def _request(self, method: str) -> SipMessage:
        """A new in-dialog request from our side (RFC 3261 12.2.1.1)."""
        self.local_cseq += 1
        msg = SipMessage(method=method, uri=self.remote_target)
        msg.add("Via", f"SIP/2.0/UDP {self.server.contact_for(self.local_ip)};branch={new_branch()};rport")
        msg.add("Max-Forwards", "70")
        msg.add("From", self._local_to())
        msg.add("To", self.invite.get("From") or "")
        msg.add("Call-ID", self.call_id)
        msg.add("CSeq", f"{self.local_cseq} {method}")
        for route in self.route_set:
            msg.add("Route", route)
        msg.add("User-Agent", self.server.user_agent)
        return msg

    async def _send_bye(self) -> None:
        bye = self._request("BYE")
        try:
            reply = await asyncio.wait_for(self.server.txns.request(bye, self._bye_destination()), 5.0)
        except TimeoutError:
            reply = None
        if reply is None:
            log.info("call %s: no answer to our BYE", self.call_id)

    def _bye_destination(self) -> Addr:
        if self.route_set:
            try:
                uri = parse_uri(parse_name_addr(self.route_set[0]).uri)
                return uri.host, uri.port or 5060
            except ValueError:
                pass
        return self.addr  # symmetric signalling: where the INVITE came from

    def _local_to(self) -> str:
        to = self.invite.get("To") or ""
        return to if ";tag=" in to else f"{to};tag={self.local_tag}"

    def _response(self, req: SipMessage, status: int, body: str | None = None) -> SipMessage:
        msg = self.server.make_response(req, status, self.addr, self.local_tag)
        msg.add("Contact", f"<sip:voice-agent@{self.server.contact_for(self.local_ip)}>")
        msg.add("Allow", ALLOW)
        if body is not None:
            msg.add("Content-Type", "application/sdp")
            msg.body = body.encode()
        return msg

    def _respond(
        self, txn: ServerTransaction, status: int, reason: str | None = None, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        msg = self.server.make_response(txn.request, status, txn.addr, self.local_tag, reason)
        if status == 180:
            msg.add("Contact", f"<sip:voice-agent@{self.server.contact_for(self.local_ip)}>")
        for name, value in extra:
            msg.add(name, value)
        self.server.txns.respond(txn, msg)


def _reason(exc: Exception) -> str:
    """An exception message fit for a status line (one short line of printable text)."""
    text = "".join(ch if ch.isprintable() else "?" for ch in str(exc))
    return text[:80] or "Bad Request"


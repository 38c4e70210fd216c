"""The SIP server over real UDP on loopback, driven by a hand-written caller (tests/sip_support.Uac).

The agent is a FakeAgent here, so these tests pin down the protocol: transactions, dialogs,
rejections, hold, DTMF and the audio path in both directions. tests/test_sip_peer.py does
the same against sipp and the real agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from pipelines.admission import Admission, CapacityConfig
from pipelines.config import SipConfig
from tests.sip_support import FakeAgent, Uac, sdp_port
from tests.speech import hello_8k
from voice.audio import read_wav
from voice.transports.sip.dtmf import build_event
from voice.transports.sip.g711 import G711, PCMA, PCMU
from voice.transports.sip.rtp import RtpPacket, seq_delta, ts_delta
from voice.transports.sip.server import SipServer
from voice.transports.sip.transaction import Timers

pytestmark = pytest.mark.timeout(60)
FAST = Timers(t1=0.05, t2=0.4, t4=0.5)  # RFC timers scaled down 10x: Timer B is 3.2 s


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return read_wav(hello_8k())[0]


@contextlib.asynccontextmanager
async def serving(agent: FakeAgent | None = None, timers: Timers = FAST, **sip) -> AsyncIterator[SipServer]:
    cfg = SipConfig(**{"bind": "127.0.0.1:0", "rtp_ports": (32000, 32999), "jitter_ms": 40, **sip})
    server = SipServer(agent or FakeAgent(), cfg, timers)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


async def establish(uac: Uac, body: str | None = None) -> tuple[str, int]:
    """INVITE, the 200, and the ACK; returns our side's RTP address."""
    uac.invite(body)
    ok = await uac.response(200)
    uac.ack()
    return "127.0.0.1", sdp_port(ok.body)


async def stream(uac: Uac, dest: tuple[str, int], pcm: np.ndarray, codec: G711 = PCMU, ssrc: int = 77) -> None:
    """Send `pcm` as 20 ms RTP packets paced on the clock, like a phone."""
    t0 = time.monotonic()
    for i in range(len(pcm) // 160):
        uac.send_rtp(RtpPacket(codec.payload_type, i, i * 160, ssrc, codec.encode(pcm[i * 160 : (i + 1) * 160]),
                               marker=i == 0), dest)  # fmt: skip
        await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))


def find(haystack: np.ndarray, needle: np.ndarray) -> int:
    """Where `needle` first occurs in `haystack` (exact samples)."""
    windows = np.lib.stride_tricks.sliding_window_view(haystack, len(needle))
    hits = np.flatnonzero((windows == needle).all(axis=1))
    assert len(hits), "the audio never arrived"
    return int(hits[0])


async def until(cond, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.02)


async def test_options_is_answered_as_a_keepalive():
    async with serving() as server, Uac((server.host, server.port)) as uac:
        uac.request("OPTIONS", "")
        ok = await uac.response(200)
        assert "INVITE" in (ok.get("Allow") or "") and ok.get("Accept") == "application/sdp"


async def test_a_call_carries_audio_both_ways_without_seams_and_ends_with_bye(speech):
    greeting = speech[: 8000 * 2]
    agent = FakeAgent(greeting=greeting)
    async with serving(agent) as server, Uac((server.host, server.port)) as uac:
        uac.invite()
        trying = await uac.response(100)
        ringing = await uac.response(180)
        ok = await uac.response(200)
        assert trying.status == 100 and ringing.get("Contact")
        assert "m=audio" in ok.body.decode() and ok.get("Content-Type") == "application/sdp"
        uac.ack()
        caller = speech[8000 * 2 : 8000 * 4]
        await stream(uac, ("127.0.0.1", sdp_port(ok.body)), caller)
        await asyncio.sleep(0.3)
        uac.request("BYE")
        await uac.response(200, "BYE")
        await until(lambda: server.finished)
    (session,) = agent.sessions.values()
    record = server.finished[0]
    assert record.reason == "caller_hangup" and session.close_reason == "caller_hangup"
    assert session.transport == "sip" and {f.sample_rate for f in session.frames} == {8000}
    # Caller -> agent: every sample arrived, in order, exactly as G.711 carries it.
    heard, carried = session.audio(), PCMU.decode(PCMU.encode(caller))
    at = find(heard, carried[:160])
    assert np.array_equal(heard[at : at + len(caller)], carried)
    stamps = np.diff([f.timestamp for f in session.frames])
    assert np.allclose(stamps, 0.02)  # a continuous call timeline at 20 ms per frame
    # Agent -> caller: one stream, numbered and stamped in 20 ms steps, the greeting intact across TTS chunks.
    packets = [p for _, p in uac.drain_rtp()]
    assert len({p.ssrc for p in packets}) == 1
    assert all(seq_delta(a.seq, b.seq) == 1 for a, b in zip(packets, packets[1:], strict=False))
    assert all(ts_delta(a.timestamp, b.timestamp) == 160 for a, b in zip(packets, packets[1:], strict=False))
    sent = np.concatenate([PCMU.decode(p.payload) for p in packets])
    expected = PCMU.decode(PCMU.encode(greeting))
    at = find(sent, expected[:160])
    assert np.array_equal(sent[at : at + len(greeting) - 40], expected[: len(greeting) - 40])  # all but the end fade
    assert packets[0].marker and sum(p.marker for p in packets) <= 2
    assert record.media["rx"]["lost"] == 0 and record.media["tx"]["packets"] == len(packets)


async def test_a_shutdown_right_after_the_callers_bye_still_records_a_caller_hangup():
    # Under load the caller's BYE and our shutdown (here: started by the same datagram) can both
    # have ended the call's wait by the time its task runs; the record must say who hung up.
    async with serving() as server, Uac((server.host, server.port)) as uac:
        await establish(uac)
        (call,) = server.calls.values()
        on_request = call.on_request
        closing: list[asyncio.Task] = []

        def then_shut_down(req, txn):
            on_request(req, txn)
            if req.method == "BYE":
                closing.append(asyncio.ensure_future(server.close()))

        call.on_request = then_shut_down
        uac.request("BYE")
        await uac.response(200, "BYE")
        await until(lambda: closing and closing[0].done())
        assert [r.reason for r in server.finished] == ["caller_hangup"]


async def test_200_ok_is_retransmitted_until_the_ack():
    async with serving() as server, Uac((server.host, server.port)) as uac:
        uac.invite()
        await uac.response(200)
        await asyncio.sleep(0.5)  # T1 = 50 ms doubling: 50, 100, 200 ... ms
        count = 0
        while True:
            try:
                await uac.response(200, within=0.05)
                count += 1
            except TimeoutError:
                break
        assert count >= 3
        uac.ack()
        await asyncio.sleep(0.2)
        with pytest.raises(TimeoutError):
            await uac.response(200, within=0.5)
        uac.request("BYE")
        await uac.response(200, "BYE")


async def test_a_missing_ack_ends_the_call_with_bye():
    async with serving(timers=Timers(t1=0.02, t2=0.2, t4=0.2)) as server, Uac((server.host, server.port)) as uac:
        uac.invite()
        await uac.response(200)
        bye = await uac.wait_request("BYE", within=6)
        assert bye.get("Call-ID") == uac.call_id
        await until(lambda: server.finished)
        assert server.finished[0].reason == "no_ack"


async def test_cancel_before_answer_gives_487_and_no_session():
    agent = FakeAgent()
    async with serving(agent, answer_delay_ms=3000) as server, Uac((server.host, server.port)) as uac:
        uac.invite()
        await uac.response(180)
        uac.cancel()
        assert (await uac.response(200, "CANCEL")).status == 200
        assert (await uac.response(487, "INVITE")).status == 487
        uac.ack(rejection=True)
        await until(lambda: server.finished)
    assert server.finished[0].reason == "cancelled" and not agent.sessions


async def test_reinvite_hold_stops_our_rtp_and_unhold_resumes_it_with_a_marker():
    async with serving() as server, Uac((server.host, server.port)) as uac:
        await establish(uac)
        await asyncio.sleep(0.3)
        uac.request("INVITE", uac.sdp(direction="sendonly"))
        held = await uac.response(200, "INVITE")
        assert "a=recvonly" in held.body.decode()
        uac.ack()
        await asyncio.sleep(0.1)
        n_before = len(uac.drain_rtp())
        await asyncio.sleep(0.4)
        assert len(uac.drain_rtp()) == n_before  # on hold: nothing sent
        uac.request("INVITE", uac.sdp(direction="sendrecv"))
        resumed = await uac.response(200, "INVITE")
        assert "a=sendrecv" in resumed.body.decode()
        uac.ack()
        await asyncio.sleep(0.3)
        after = [p for _, p in uac.drain_rtp()[n_before:]]
        assert len(after) >= 5 and after[0].marker
        assert ts_delta(uac.rtp[n_before - 1][1].timestamp, after[0].timestamp) > 160 * 10  # time went on
        uac.request("BYE")
        await uac.response(200, "BYE")


async def test_delayed_offer_gets_our_offer_and_uses_the_answer_in_the_ack(speech):
    agent = FakeAgent(greeting=speech[:4000])
    async with serving(agent) as server, Uac((server.host, server.port)) as uac:
        uac.invite(body="")
        ok = await uac.response(200)
        assert "RTP/AVP 0 8 101" in ok.body.decode()
        uac.ack(body=uac.sdp(codecs="8"))
        await asyncio.sleep(0.6)
        packets = [p for _, p in uac.drain_rtp()]
        assert packets and {p.payload_type for p in packets} == {PCMA.payload_type}
        uac.request("BYE")
        await uac.response(200, "BYE")


async def test_over_the_call_limit_the_caller_gets_486():
    agent = FakeAgent()
    async with serving(agent, max_calls=1) as server:
        async with Uac((server.host, server.port)) as first, Uac((server.host, server.port)) as second:
            await establish(first)
            second.invite()
            busy = await second.response()
            assert busy.status == 486 and len(agent.sessions) == 1
            second.ack(rejection=True)
            first.request("BYE")
            await first.response(200, "BYE")
        await until(lambda: server.active_calls == 0)
        async with Uac((server.host, server.port)) as third:  # the slot is free again
            await establish(third)
            third.request("BYE")
            await third.response(200, "BYE")


class AdmittingFakeAgent(FakeAgent):
    """FakeAgent (recording sessions) with the real agent-level `Admission` in front."""

    def __init__(self, **capacity) -> None:
        super().__init__()
        self.admission = Admission(CapacityConfig(**capacity))

    def admit(self, transport: str):
        return self.admission.admit(transport)

    def new_session(self, output, clock, transport, session_id=None, seat=None):
        assert seat is not None and seat.held, "the bridge answers only calls it was admitted for"
        return super().new_session(output, clock, transport, session_id)


async def test_beyond_the_agents_shared_capacity_the_caller_gets_486():
    agent = AdmittingFakeAgent(max_calls=2)
    other = agent.admission.take("webrtc")  # a call on another transport of the same agent
    async with serving(agent) as server:  # sip.max_calls unset: the agent's capacity decides
        async with Uac((server.host, server.port)) as first, Uac((server.host, server.port)) as second:
            await establish(first)
            assert agent.admission.live == 2
            second.invite()
            busy = await second.response()
            assert busy.status == 486 and busy.get("Retry-After") == "5" and len(agent.sessions) == 1
            second.ack(rejection=True)
            first.request("BYE")
            await first.response(200, "BYE")
        await until(lambda: agent.admission.live == 1)  # the call's seat is given back
        other.release()
        async with Uac((server.host, server.port)) as a, Uac((server.host, server.port)) as b:
            await establish(a)
            await establish(b)  # both places free again
            for uac in (a, b):
                uac.request("BYE")
                await uac.response(200, "BYE")
        await until(lambda: agent.admission.live == 0)
    await agent.admission.aclose()


async def test_while_the_event_loop_lags_the_caller_gets_503_with_retry_after():
    agent = AdmittingFakeAgent(overload_lag_ms=50, overload_window_s=0.5, retry_after_s=9)
    async with serving(agent) as server:
        agent.admission.lag.ensure_running()
        await asyncio.sleep(0.2)
        async with Uac((server.host, server.port)) as uac:
            time.sleep(0.3)  # the loop is blocked, as by a model run on it
            uac.invite()
            refused = await uac.response()
            assert (refused.status, refused.get("Retry-After")) == (503, "9")
            assert not agent.sessions and agent.admission.live == 0
            uac.ack(rejection=True)
        await asyncio.sleep(0.8)  # the lag has left the window: calls are answered again
        async with Uac((server.host, server.port)) as uac:
            await establish(uac)
            uac.request("BYE")
            await uac.response(200, "BYE")
    await agent.admission.aclose()


async def test_a_cancelled_call_gives_its_seat_back():
    agent = AdmittingFakeAgent(max_calls=1)
    async with serving(agent, answer_delay_ms=2000) as server:
        async with Uac((server.host, server.port)) as uac:
            uac.invite()
            await uac.response(180)
            assert agent.admission.live == 1
            uac.cancel()
            await uac.response(200, "CANCEL")
            await uac.response(487, "INVITE")
            uac.ack(rejection=True)
        await until(lambda: agent.admission.live == 0)
    await agent.admission.aclose()


async def test_a_source_outside_the_allowlist_gets_403_and_no_session():
    agent = FakeAgent()
    async with serving(agent, allow=["10.0.0.0/8"]) as server, Uac((server.host, server.port)) as uac:
        uac.invite()
        assert (await uac.response()).status == 403
        uac.request("OPTIONS")
        assert (await uac.response()).status == 403
    assert not agent.sessions and server.counters["forbidden"] == 2


@pytest.mark.parametrize(
    "method,body,ctype,extra,status",
    [
        ("INVITE", "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
         "m=audio 4000 RTP/AVP 18\r\n", "application/sdp", (), 488),
        ("INVITE", "v=0\r\nthis is not sdp\r\n", "application/sdp", (), 400),
        ("INVITE", "hello", "text/plain", (), 415),
        ("INVITE", None, "application/sdp", (("Require", "100rel"),), 420),
        ("BYE", "", "", (), 481),
        ("INFO", "", "", (), 481),
        ("REGISTER", "", "", (), 405),
    ],
)  # fmt: skip
async def test_requests_we_cannot_serve_get_the_right_status(method, body, ctype, extra, status):
    agent = FakeAgent()
    async with serving(agent) as server, Uac((server.host, server.port)) as uac:
        if body is None:
            body = uac.sdp()
        uac.request(method, body, ctype=ctype, extra=extra)
        assert (await uac.response()).status == status
        if method == "INVITE":
            uac.ack(rejection=True)
    assert not agent.sessions


async def test_digest_authentication_challenges_then_admits_the_caller():
    from tests.test_sip_signalling import _authorization

    agent = FakeAgent()
    async with serving(agent, auth_user="alice", auth_password="pw") as server, Uac((server.host, server.port)) as uac:
        uac.invite()
        challenge = await uac.response(401)
        uac.ack(rejection=True)
        uri = f"sip:agent@{server.host}:{server.port}"
        cred = _authorization(challenge.get("WWW-Authenticate") or "", "alice", "pw", uri)
        wrong = _authorization(challenge.get("WWW-Authenticate") or "", "alice", "guess", uri)
        uac.invite(extra=(("Authorization", wrong),))
        assert (await uac.response()).status == 401
        uac.ack(rejection=True)
        assert not agent.sessions
        uac.invite(extra=(("Authorization", cred),))
        await uac.response(200)
        uac.ack()
        assert len(agent.sessions) == 1
        uac.request("BYE")
        await uac.response(200, "BYE")


async def test_agent_hangup_plays_out_then_sends_bye(speech):
    agent = FakeAgent(greeting=speech[:4000])
    async with serving(agent) as server, Uac((server.host, server.port)) as uac:
        await establish(uac)
        (session,) = agent.sessions.values()
        session.hangup_requested.set()
        bye = await uac.wait_request("BYE")
        assert parse_tag(bye.get("From")) == uac.to_tag and parse_tag(bye.get("To")) == uac.from_tag
        assert sum(1 for _, p in uac.drain_rtp() if PCMU.decode(p.payload).any()) >= 4000 // 160  # it played
        await until(lambda: server.finished)
        assert server.finished[0].reason == "agent_hangup"


def parse_tag(value: str | None) -> str | None:
    from voice.transports.sip.message import parse_name_addr

    return parse_name_addr(value or "").tag


async def test_silent_rtp_times_out_the_call():
    async with serving(rtp_timeout_s=1) as server, Uac((server.host, server.port)) as uac:
        await establish(uac)
        await uac.wait_request("BYE", within=5)
        await until(lambda: server.finished)
        assert server.finished[0].reason == "rtp_timeout"


async def test_dtmf_by_rfc4733_and_by_info_reach_the_session():
    agent = FakeAgent()
    async with serving(agent) as server, Uac((server.host, server.port)) as uac:
        dest = await establish(uac)
        for i, (dur, end) in enumerate([(160, False), (320, False), (480, True), (480, True), (480, True)]):
            uac.send_rtp(RtpPacket(101, 500 + i, 8000, 9, build_event(9, end, dur), marker=i == 0), dest)
        uac.request("INFO", "Signal=#\r\nDuration=250\r\n", ctype="application/dtmf-relay")
        assert (await uac.response()).status == 200
        uac.request("INFO", "Signal=5", ctype="application/json")
        assert (await uac.response()).status == 415
        (session,) = agent.sessions.values()
        await until(lambda: len(session.digits) == 2)
        assert sorted(session.digits) == [("#", 250), ("9", 60)]
        uac.request("BYE")
        await uac.response(200, "BYE")


async def test_in_dialog_requests_must_raise_the_cseq():
    async with serving() as server, Uac((server.host, server.port)) as uac:
        await establish(uac)
        uac.request("OPTIONS")
        assert (await uac.response()).status == 200
        uac.request("BYE", cseq=1)
        assert (await uac.response()).status == 500
        uac.request("BYE")
        assert (await uac.response()).status == 200


async def test_rtp_from_a_source_outside_the_allowlist_is_ignored(speech):
    agent = FakeAgent()
    async with serving(agent, allow=["127.0.0.1/32"]) as server, Uac((server.host, server.port)) as uac:
        dest = await establish(uac)
        async with Uac((server.host, server.port), ip="127.0.0.2") as intruder:
            for i in range(20):
                intruder.send_rtp(RtpPacket(0, i, i * 160, 666, PCMU.encode(speech[:160])), dest)
        await stream(uac, dest, speech[:1600])
        await asyncio.sleep(0.2)
        uac.request("BYE")
        await uac.response(200, "BYE")
        await until(lambda: server.finished)
    rx = server.finished[0].media["rx"]
    assert rx["rejected_source"] == 20 and rx["received"] == 10


async def test_shutdown_hangs_up_live_calls():
    server = SipServer(FakeAgent(), SipConfig(bind="127.0.0.1:0", rtp_ports=(32000, 32999)), FAST)
    await server.start()
    async with Uac((server.host, server.port)) as uac:
        await establish(uac)
        closing = asyncio.create_task(server.close())
        assert (await uac.wait_request("BYE")).method == "BYE"
        await closing
    assert server.finished[0].reason == "shutdown"

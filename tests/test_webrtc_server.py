"""The WebRTC server against real aiortc peers on loopback, with the call session faked.

FakeAgent/FakeSession stand in for the pipeline so these tests isolate the transport: what
the browser sends must reach the session as 16 kHz frames, what the session plays must reach
the peer, events must cross the data channel, and a vanished peer must end only its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from pipelines.admission import Admission, CapacityConfig
from pipelines.config import AgentConfig
from pipelines.events import EventBus, Partial, SessionEnd, SessionStart
from pipelines.serve_webrtc import WebrtcServer
from tests.speech import cards, librivox
from voice.audio import AudioFrame, read_wav, resample
from voice.transports.webrtc import av_frame_to_mono

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]
TOKEN = "test-token"


class FakeSession:
    def __init__(self, bus: EventBus, output: Any, clock: Any, transport: str, session_id: str) -> None:
        self.bus, self.output, self.clock, self.transport, self.id = bus, output, clock, transport, session_id
        self.frames: list[AudioFrame] = []
        self.hangup_requested = asyncio.Event()
        self.closed_reason: str | None = None

    async def start(self) -> None:
        self.bus.emit(SessionStart(self.id, self.clock.now(), transport=self.transport))

    async def push_audio(self, frame: AudioFrame) -> None:
        self.frames.append(frame)

    async def close(self, reason: str = "completed") -> dict[str, Any]:
        if self.closed_reason is None:
            self.closed_reason = reason
            self.bus.emit(SessionEnd(self.id, self.clock.now(), reason=reason))
        return {"reason": reason, "turns": []}

    def heard(self) -> np.ndarray:
        return np.concatenate([f.pcm for f in self.frames]) if self.frames else np.zeros(0, np.int16)


class FakeAgent:
    def __init__(self) -> None:
        self.bus = EventBus()
        self.sessions: dict[str, FakeSession] = {}

    def new_session(self, output: Any, clock: Any, transport: str, session_id: str | None = None) -> FakeSession:
        assert session_id
        s = FakeSession(self.bus, output, clock, transport, session_id)
        self.sessions[session_id] = s
        return s


class SpeechTrack(MediaStreamTrack):
    """A microphone that says one recorded clip at 48 kHz, then stays silent (paced in real time)."""

    kind = "audio"

    def __init__(self, pcm48: np.ndarray) -> None:
        super().__init__()
        self.pcm = pcm48
        self.pts = 0
        self.t0: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.t0 is None:
            self.t0 = time.monotonic()
        else:
            self.pts += 960
            await asyncio.sleep(max(0.0, self.t0 + self.pts / 48000 - time.monotonic()))
        chunk = self.pcm[self.pts : self.pts + 960]
        chunk = np.pad(chunk, (0, 960 - len(chunk)))
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1).astype(np.int16), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = 48000, self.pts, fractions.Fraction(1, 48000)
        return frame


class Caller:
    """A Python WebRTC peer that calls the server the way the page does."""

    def __init__(self, pcm48: np.ndarray) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("events")
        self.messages: list[dict[str, Any]] = []
        self.received: list[np.ndarray] = []
        self.session_id = ""
        self._reader: asyncio.Task[None] | None = None
        self.channel.on("message", lambda m: self.messages.append(json.loads(m)))
        self.pc.addTrack(SpeechTrack(pcm48))

        @self.pc.on("track")
        def _on_track(track: MediaStreamTrack) -> None:
            self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                self.received.append(av_frame_to_mono(await track.recv()))

    async def call(self, url: str, token: str = TOKEN) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with aiohttp.ClientSession() as http:
            resp = await http.post(
                url + "offer",
                json={"sdp": self.pc.localDescription.sdp, "type": "offer"},
                headers={"Authorization": f"Bearer {token}"},
            )
            body = await resp.json()
            assert resp.status == 200, body
        self.session_id = body["session_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(body["sdp"], "answer"))

    def audio(self) -> np.ndarray:
        return np.concatenate(self.received) if self.received else np.zeros(0, np.int16)

    def types(self) -> list[str]:
        return [m.get("type", "") for m in self.messages]

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()

    async def vanish(self) -> None:
        """Stop dead, the way a crashed browser or a pulled cable does: no DTLS close, no BYE."""
        for t in self.pc.getTransceivers():
            await t.sender.transport.transport._connection.close()


def envelope(pcm: np.ndarray, rate: int) -> np.ndarray:
    n = rate // 50
    frames = pcm[: len(pcm) // n * n].astype(np.float32).reshape(-1, n)
    return np.sqrt((frames**2).mean(axis=1))


def best_envelope_match(got: np.ndarray, ref: np.ndarray) -> float:
    """Correlation of 20 ms loudness envelopes at the best alignment (Opus keeps the envelope)."""
    best = -1.0
    for lag in range(0, max(1, len(got) - len(ref) + 1)):
        seg = got[lag : lag + len(ref)]
        if len(seg) < len(ref) * 0.9:
            break
        best = max(best, float(np.corrcoef(seg, ref[: len(seg)])[0, 1]))
    return best


async def wait_for(cond: Any, within: float, step: float = 0.05) -> None:
    end = time.monotonic() + within
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(step)


@pytest.fixture
async def server() -> Any:
    cfg = AgentConfig()
    cfg.webrtc.max_sessions = 3
    srv = WebrtcServer(FakeAgent(), cfg, TOKEN, idle_timeout_s=2.0)
    await srv.start("127.0.0.1", 0)
    yield srv
    await srv.stop()


def speech48(i: int) -> tuple[np.ndarray, np.ndarray]:
    pcm16, _ = read_wav(librivox()[i].path)
    return pcm16, resample(pcm16, 16000, 48000)


async def test_call_carries_audio_and_events_both_ways(server: WebrtcServer) -> None:
    said16, said48 = speech48(1)  # 3 s of recorded speech as the caller's microphone
    caller = Caller(np.concatenate([said48, np.zeros(48000, np.int16)]))
    await caller.call(server.url)
    session = server.agent.sessions[caller.session_id]
    assert session.transport == "webrtc"
    await wait_for(lambda: len(session.heard()) >= len(said16) + 8000, 15)
    heard = session.heard()
    assert {f.sample_rate for f in session.frames} == {16000}
    for a, b in zip(session.frames, session.frames[1:], strict=False):
        assert b.timestamp == pytest.approx(a.end, abs=1e-6)  # one continuous timeline
    assert best_envelope_match(envelope(heard, 16000), envelope(said16, 16000)) > 0.9

    # the agent speaks: a different recorded clip, played through the session's output
    reply16, _ = read_wav(cards()[1].path)
    n_before = len(caller.audio())
    starts = session.output.play(resample(reply16, 16000, 48000))
    assert starts >= session.clock.now()
    await wait_for(lambda: len(caller.audio()) - n_before >= 48000 * 2.6, 10)
    got = caller.audio()[n_before:]
    assert best_envelope_match(envelope(got, 48000), envelope(resample(reply16, 16000, 48000), 48000)) > 0.9

    # events for this session reach its data channel as JSON
    server.agent.bus.emit(Partial(caller.session_id, 1.0, text="he was not", stable="he was"))
    server.agent.bus.emit(Partial("some-other-session", 1.0, text="not for you"))
    await wait_for(lambda: "partial" in caller.types(), 5)
    partials = [m for m in caller.messages if m["type"] == "partial"]
    assert [p["text"] for p in partials] == ["he was not"]
    assert caller.messages[0]["type"] == "session/start" and caller.messages[0]["transport"] == "webrtc"

    # the browser hangs up over the data channel
    caller.channel.send(json.dumps({"type": "hangup"}))
    await wait_for(lambda: session.closed_reason is not None, 5)
    assert session.closed_reason == "hangup"
    await wait_for(lambda: "session/end" in caller.types(), 5)
    await wait_for(lambda: not server.calls, 5)
    await caller.close()


async def test_vanished_peer_ends_only_its_own_call(server: WebrtcServer) -> None:
    _, said48 = speech48(2)
    a, b = Caller(said48), Caller(said48)
    await a.call(server.url)
    await b.call(server.url)
    sa, sb = server.agent.sessions[a.session_id], server.agent.sessions[b.session_id]
    assert len(server.calls) == 2 and a.session_id != b.session_id
    await wait_for(lambda: len(sa.frames) > 20 and len(sb.frames) > 20, 10)
    await a.vanish()
    t0 = time.monotonic()
    await wait_for(lambda: sa.closed_reason is not None, 10)
    assert sa.closed_reason == "peer_gone"
    assert time.monotonic() - t0 < 6  # idle timeout (2 s) plus the jitter buffer, not ICE's 30 s
    await wait_for(lambda: list(server.calls) == [b.session_id], 3)
    assert sb.closed_reason is None
    n = len(sb.frames)
    await asyncio.sleep(0.5)
    assert len(sb.frames) > n  # the other call still flows
    await b.close()  # a clean close: DTLS close_notify
    await wait_for(lambda: sb.closed_reason is not None, 10)
    await wait_for(lambda: not server.calls, 5)
    await a.close()


async def test_bad_requests_get_4xx_and_the_server_keeps_serving(server: WebrtcServer) -> None:
    pcmu_only = (
        "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
        "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        cases = [
            ({"json": {"sdp": pcmu_only, "type": "offer"}}, 401, "missing token"),
            ({"json": {"sdp": pcmu_only, "type": "offer"}, "headers": {"Authorization": "Bearer nope"}}, 403, "wrong"),
            ({"json": {"sdp": pcmu_only, "type": "offer", "token": "nope"}}, 403, "wrong"),
            ({"data": b"{not json", "headers": auth}, 400, "JSON"),
            ({"json": ["sdp"], "headers": auth}, 400, "JSON object"),
            ({"json": {"sdp": "hello", "type": "offer"}, "headers": auth}, 400, "v=0"),
            ({"json": {"sdp": pcmu_only, "type": "offer"}, "headers": auth}, 415, "Opus"),
            ({"json": {"sdp": pcmu_only, "type": "offer", "token": TOKEN}}, 415, "Opus"),
        ]
        for kwargs, status, words in cases:
            resp = await http.post(server.url + "offer", **kwargs)
            body = await resp.json()
            assert resp.status == status, (kwargs, body)
            assert words in body["error"]
        resp = await http.post(server.url + "calls/nosuch/hangup", json={"token": TOKEN})
        assert resp.status == 404
        resp = await http.get(server.url + "health")
        assert (await resp.json()) == {"sessions": 0, "max_sessions": 3}
        page = await http.get(server.url)
        assert page.status == 200 and "app.js" in await page.text()
        js = await http.get(server.url + "app.js")
        assert js.status == 200 and js.content_type == "application/javascript"
    assert not server.calls
    caller = Caller(speech48(2)[1])
    await caller.call(server.url)  # still answers real calls
    assert len(server.calls) == 1
    await caller.close()


async def test_full_server_says_busy(server: WebrtcServer) -> None:
    server.config.webrtc.max_sessions = 1
    _, said48 = speech48(2)
    first = Caller(said48)
    await first.call(server.url)
    second = Caller(said48)
    await second.pc.setLocalDescription(await second.pc.createOffer())
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            server.url + "offer", json={"sdp": second.pc.localDescription.sdp, "type": "offer", "token": TOKEN}
        )
        assert resp.status == 503 and "busy" in (await resp.json())["error"]
    await first.close()
    await second.close()


class AdmittingFakeAgent(FakeAgent):
    """FakeAgent (recording sessions) with the real agent-level `Admission` in front."""

    def __init__(self, max_calls: int) -> None:
        super().__init__()
        self.admission = Admission(CapacityConfig(max_calls=max_calls, retry_after_s=3))

    def admit(self, transport: str) -> Any:
        return self.admission.admit(transport)

    def new_session(self, output: Any, clock: Any, transport: str, session_id: str | None = None,
                    seat: Any = None) -> FakeSession:
        assert seat is not None and seat.held, "the endpoint sets up only calls it was admitted for"
        return super().new_session(output, clock, transport, session_id)


async def test_beyond_the_agents_shared_capacity_an_offer_gets_503_with_retry_after() -> None:
    agent = AdmittingFakeAgent(max_calls=2)
    srv = WebrtcServer(agent, AgentConfig(), TOKEN, idle_timeout_s=2.0)  # webrtc.max_sessions unset
    await srv.start("127.0.0.1", 0)
    other = agent.admission.take("sip")  # a phone call on the same agent
    _, said48 = speech48(2)
    first, second = Caller(said48), Caller(said48)
    try:
        await first.call(srv.url)
        assert agent.admission.live == 2
        await second.pc.setLocalDescription(await second.pc.createOffer())
        async with aiohttp.ClientSession() as http:
            resp = await http.post(
                srv.url + "offer", json={"sdp": second.pc.localDescription.sdp, "type": "offer", "token": TOKEN}
            )
            assert resp.status == 503 and resp.headers["Retry-After"] == "3"
            assert "busy: 2 calls in progress (max 2)" in (await resp.json())["error"]
        assert len(agent.sessions) == 1 and len(srv.calls) == 1  # nothing was set up for it
        await first.close()
        for call in list(srv.calls.values()):  # the caller hung up: the server ends the call
            await call.close("hangup")
        for _ in range(100):
            if agent.admission.live == 1:
                break
            await asyncio.sleep(0.05)
        assert agent.admission.live == 1  # the call's seat is back; the phone call still holds one
        other.release()
    finally:
        await second.close()
        await srv.stop()
        await agent.admission.aclose()

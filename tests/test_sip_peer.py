"""The SIP bridge against a real SIP peer: sipp (Debian sip-tester), on loopback.

sipp plays RTP from pcap files with a raw socket, and the pacing check captures packets on
`lo` with an AF_PACKET socket, so these tests need root (CAP_NET_RAW); they skip without it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.config import SipConfig
from tests.sip_support import (
    SCENARIOS,
    SIPP,
    SIPP_PCAPS,
    FakeAgent,
    LoopbackCapture,
    free_udp_port,
    free_udp_ports,
    read_rtp_pcap,
    run_sipp,
    sipp_log,
    sipp_workdir,
    write_rtp_pcap,
)
from tests.speech import hello_8k, librivox
from tests.wer import wer
from voice.audio import read_wav
from voice.transports.sip.g711 import PCMA, PCMU
from voice.transports.sip.rtp import RtpPacket, seq_delta, ts_delta
from voice.transports.sip.server import SipServer

# below Linux's ephemeral range (32768-60999): sipp's [auto_media_port] is an ephemeral port,
# and one that landed in the server's range was captured as a second "server" stream
RTP_PORTS = (24000, 24999)
pytestmark = [
    pytest.mark.peer,
    pytest.mark.timeout(180),
    pytest.mark.skipif(SIPP is None, reason="sipp (Debian sip-tester) is not installed"),
    pytest.mark.skipif(os.geteuid() != 0 or not LoopbackCapture.available(),
                       reason="sipp's pcap playback and the loopback capture need CAP_NET_RAW"),
]  # fmt: skip


@pytest.fixture(scope="module")
def greeting() -> np.ndarray:
    return read_wav(hello_8k())[0][: 8000 * 4]


async def start(agent: Any, **sip: Any) -> SipServer:
    server = SipServer(agent, SipConfig(**{"bind": "127.0.0.1:0", "rtp_ports": RTP_PORTS, **sip}))
    await server.start()
    return server


def sipp_args(*extra: str, calls: int = 1) -> list[str]:
    return ["-m", str(calls), "-p", str(free_udp_port()), "-mp", str(free_udp_ports(4 * calls)), *extra]


def check_pacing(packets: list[Any], codec_pt: int) -> np.ndarray:
    """One RTP stream as captured on the wire: numbering, timestamps and 20 ms pacing."""
    rtp = [RtpPacket.parse(p.payload) for p in packets]
    assert len({p.ssrc for p in rtp}) == 1 and {p.payload_type for p in rtp} == {codec_pt}
    assert all(seq_delta(a.seq, b.seq) == 1 for a, b in zip(rtp, rtp[1:], strict=False))
    assert all(ts_delta(a.timestamp, b.timestamp) == 160 for a, b in zip(rtp, rtp[1:], strict=False))
    assert all(len(p.payload) == 160 for p in rtp)
    t = np.array([p.t for p in packets])
    gaps_ms = np.diff(t) * 1000
    span_ms = (t[-1] - t[0]) * 1000
    # No drift: the stream spans exactly its packet count (absolute schedule, not sleep(20 ms)).
    assert span_ms == pytest.approx((len(t) - 1) * 20, rel=0.005)
    # Pacing: the typical gap is 20 ms; a loaded 2-core host may still delay a few packets.
    assert float(np.median(np.abs(gaps_ms - 20))) < 1.0
    assert float(np.mean(np.abs(gaps_ms - 20) < 5)) > 0.9
    return gaps_ms


async def test_sipp_uac_pcap_pcma_call_with_dtmf(tmp_path, greeting):
    """sipp's own scenario: PCMA speech from its bundled capture, then RFC 4733 digit 1, then BYE."""
    agent = FakeAgent(greeting=greeting)
    server = await start(agent)
    try:
        with LoopbackCapture(range(*RTP_PORTS)) as cap:
            run = await run_sipp((server.host, server.port), sipp_args("-sn", "uac_pcap"), sipp_workdir(tmp_path))
            await asyncio.sleep(0.2)
    finally:
        await server.close()
    assert run.returncode == 0, sipp_log(tmp_path)  # sipp: 1 successful call
    (record,) = server.finished
    (session,) = agent.sessions.values()
    expected = sum(len(p.payload) for p in read_rtp_pcap(SIPP_PCAPS / "g711a.pcap"))  # 236 packets x 30 ms
    rx = record.media["rx"]
    assert record.codec == "PCMA" and record.reason == "caller_hangup"
    assert rx["samples_received"] == expected and rx["lost"] == 0 and rx["late"] == 0
    assert session.digits == [("1", 280)] and record.media["dtmf"] == "1"
    assert sum(len(f.pcm) for f in session.frames) >= expected  # all of it reached the session, at 8 kHz
    stream = cap.call_stream()
    gaps = check_pacing(stream, PCMA.payload_type)
    sent = np.concatenate([PCMA.decode(RtpPacket.parse(p.payload).payload) for p in stream])
    carried = PCMA.decode(PCMA.encode(greeting))
    assert np.array_equal(sent[: len(greeting) - 40], carried[: len(greeting) - 40])  # seamless across TTS chunks
    dev = np.abs(gaps - 20)
    print(f"pacing: {len(gaps) + 1} packets, mean {gaps.mean():.3f} ms, |dev| p50 {np.median(dev):.3f} ms, "
          f"p99 {np.percentile(dev, 99):.2f} ms, max {dev.max():.2f} ms")  # fmt: skip


async def test_sipp_concurrent_calls(tmp_path, greeting):
    """Eight sipp calls, four at a time, each an independent session."""
    agent = FakeAgent(greeting=greeting)
    server = await start(agent, max_calls=4)
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, server.active_calls)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        args = sipp_args("-sn", "uac_pcap", "-l", "4", "-r", "10", calls=8)
        run = await run_sipp((server.host, server.port), args, sipp_workdir(tmp_path), limit_s=90)
    finally:
        watcher.cancel()
        await server.close()
    assert run.returncode == 0, sipp_log(tmp_path)
    assert len(server.finished) == 8 and peak == 4 and server.counters["busy"] == 0
    assert len({r.call_id for r in server.finished}) == 8 and len(agent.sessions) == 8
    for r in server.finished:
        assert r.reason == "caller_hangup" and r.media["dtmf"] == "1" and r.media["rx"]["samples_received"] == 56640


async def test_sipp_digest_authentication(tmp_path):
    """sipp answers our challenge with its own digest code (a wrong password is tested in test_sip_server)."""
    agent = FakeAgent()
    server = await start(agent, auth_user="alice", auth_password="s3cret")
    try:
        args = sipp_args("-sf", str(SCENARIOS / "uac_auth.xml"), "-au", "alice", "-ap", "s3cret", "-d", "500")
        run = await run_sipp((server.host, server.port), args, sipp_workdir(tmp_path))
    finally:
        await server.close()
    assert run.returncode == 0, sipp_log(tmp_path)
    assert server.counters["auth_challenges"] == 1 and len(agent.sessions) == 1


async def test_sipp_hold_and_resume(tmp_path, greeting):
    agent = FakeAgent(greeting=np.tile(greeting, 2))
    server = await start(agent)
    try:
        with LoopbackCapture(range(*RTP_PORTS)) as cap:
            args = sipp_args("-sf", str(SCENARIOS / "uac_hold.xml"), "-d", "1500")
            run = await run_sipp((server.host, server.port), args, sipp_workdir(tmp_path))
    finally:
        await server.close()
    assert run.returncode == 0, sipp_log(tmp_path)
    stream = cap.call_stream()
    t = np.array([p.t for p in stream])
    rtp = [RtpPacket.parse(p.payload) for p in stream]
    gap = int(np.argmax(np.diff(t)))
    assert 1.2 < t[gap + 1] - t[gap] < 2.5  # silent while on hold
    assert rtp[gap + 1].marker and ts_delta(rtp[gap].timestamp, rtp[gap + 1].timestamp) > 160 * 50
    assert server.finished[0].reason == "caller_hangup"


async def test_sipp_cancel_while_ringing(tmp_path):
    agent = FakeAgent()
    server = await start(agent, answer_delay_ms=5000)
    try:
        args = sipp_args("-sf", str(SCENARIOS / "uac_cancel.xml"))
        run = await run_sipp((server.host, server.port), args, sipp_workdir(tmp_path))
    finally:
        await server.close()
    assert run.returncode == 0, sipp_log(tmp_path)  # no 487 retransmission after the ACK
    assert server.finished[0].reason == "cancelled" and not agent.sessions


@pytest.mark.slow
async def test_sipp_pcmu_speech_gets_a_spoken_answer(tmp_path, agent):
    """The real agent on the phone: sipp streams recorded speech as PCMU and hears the reply."""
    clip = librivox()[3]  # "had he married a more amiable woman ..." (6 s)
    speech = read_wav(clip.path, 8000)[0]
    packets = write_rtp_pcap(tmp_path / "speech.pcap", speech, PCMU)
    server = await start(agent)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # as `voice-agent serve sip` runs
    try:
        with LoopbackCapture(range(*RTP_PORTS)) as cap:
            args = sipp_args("-sf", str(SCENARIOS / "uac_pcmu.xml"), "-d", str(packets * 20 + 7000))
            run = await run_sipp((server.host, server.port), args, sipp_workdir(tmp_path), limit_s=60)
    finally:
        sys.setswitchinterval(switch)
        await server.close()
    assert run.returncode == 0, sipp_log(tmp_path)
    (record,) = server.finished
    assert record.codec == "PCMU" and record.media["rx"]["received"] == packets
    turns = record.report["turns"]
    transcript = " ".join(t["transcript"] for t in turns)
    assert wer(clip.text, transcript) <= 0.35, transcript
    answered = [t for t in turns if t["agent_audio_start_s"] is not None]
    assert answered and answered[0]["response"].strip()
    stream = cap.call_stream()
    check_pacing(stream, PCMU.payload_type)
    rtp = [RtpPacket.parse(p.payload) for p in stream]
    voiced = [p for p in rtp if np.abs(PCMU.decode(p.payload).astype(np.int32)).max() > 500]
    assert len(voiced) >= 10  # the agent's spoken reply went back to sipp as RTP
    assert any(p.marker for p in rtp[1:])  # its talk spurt was flagged
    assert record.media["tx"]["seconds_of_agent_audio"] > 0.2


async def test_sipp_a_caller_who_falls_silent_is_asked_then_hung_up_on(tmp_path, engines):
    """The real agent on the phone, greeting and idle prompts on: sipp says one sentence over
    the greeting, then sends only silence; the agent answers, asks once, says goodbye and
    sends BYE (sipp fails the call without it)."""
    from pipelines.agent import Agent
    from pipelines.config import AgentConfig, TurnConfig

    turn = TurnConfig(greeting="Hello, you are through to the assistant.", idle_prompt_s=1.5, idle_hangup_after=1)
    agent = Agent(AgentConfig(turn=turn), engines)
    speech = read_wav(librivox()[1].path, 8000)[0]
    line = np.concatenate([np.zeros(8000, np.int16), speech, np.zeros(8000 * 20, np.int16)])  # then silence
    write_rtp_pcap(tmp_path / "speech.pcap", line, PCMU)
    server = await start(agent)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # as `voice-agent serve sip` runs
    try:
        args = sipp_args("-sf", str(SCENARIOS / "uac_silent.xml"))
        run = await run_sipp((server.host, server.port), args, sipp_workdir(tmp_path), limit_s=60)
    finally:
        sys.setswitchinterval(switch)
        await server.close()
    assert run.returncode == 0, sipp_log(tmp_path)  # the agent's BYE came, and was answered
    (record,) = server.finished
    assert record.reason == "agent_hangup"
    report = record.report
    assert [s["why"] for s in report["said"]] == ["greeting", "idle", "goodbye"]
    assert report["turns"] and report["turns"][0]["agent_audio_start_s"] is not None
    said = report["said"]
    assert said[2]["audio_start_s"] - said[1]["audio_start_s"] >= 1.5
    assert report["call"]["duration_s"] < len(line) / 8000 - 5.0  # hung up long before the line went quiet


def test_scenarios_are_valid_xml():
    import xml.etree.ElementTree as ET

    for f in Path(SCENARIOS).glob("*.xml"):
        assert ET.parse(f).getroot().tag == "scenario"


async def _transferred_by_operator(tmp_path, agent, scenario: str) -> tuple[Any, Any]:
    """sipp says a sentence; two seconds into the call an operator asks for a transfer (as an
    MQTT `transfer` does: `CallSession.request_transfer`), and the call runs `scenario`."""
    speech = read_wav(librivox()[1].path, 8000)[0]
    line = np.concatenate([np.zeros(8000, np.int16), speech, np.zeros(8000 * 10, np.int16)])
    write_rtp_pcap(tmp_path / "speech.pcap", line, PCMU)
    server = await start(agent)

    async def operator() -> None:
        while not agent.sessions:
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)
        next(iter(agent.sessions.values())).request_transfer("sip:desk@example.com")

    task = asyncio.create_task(operator())
    try:
        args = sipp_args("-sf", str(SCENARIOS / scenario))
        run = await run_sipp((server.host, server.port), args, sipp_workdir(tmp_path), limit_s=60)
    finally:
        task.cancel()
        await server.close()
    return run, server


@pytest.mark.slow
async def test_sipp_a_call_is_transferred_by_refer_and_then_ended(tmp_path, agent):
    """The agent REFERs the caller to the transfer target; sipp accepts, reports the target's
    200 in a NOTIFY, and gets the agent's BYE (sipp fails the call without each of them)."""
    run, server = await _transferred_by_operator(tmp_path, agent, "uac_transfer.xml")
    assert run.returncode == 0, sipp_log(tmp_path)
    (record,) = server.finished
    assert record.reason == "transferred"
    transfer = record.report["call"]["transfer"]
    assert transfer["to"] == "sip:desk@example.com" and transfer["why"] == "operator"
    assert transfer["result"] == "transferred"


@pytest.mark.slow
async def test_sipp_a_declined_transfer_leaves_the_call_with_the_agent(tmp_path, agent):
    """sipp declines the REFER (603); the call goes on with the agent until sipp hangs up."""
    run, server = await _transferred_by_operator(tmp_path, agent, "uac_transfer_declined.xml")
    assert run.returncode == 0, sipp_log(tmp_path)
    (record,) = server.finished
    assert record.reason == "caller_hangup"
    assert record.report["call"]["transfer"]["result"] == "refused: 603 Decline"


@pytest.mark.slow
async def test_sipp_a_caller_who_hangs_up_during_the_transfer_ends_the_call_at_once(tmp_path, agent):
    """sipp accepts the REFER (202) and hangs up with no NOTIFY: the agent stops waiting for
    the transfer target's answer and the call ends as the caller's hangup."""
    run, server = await _transferred_by_operator(tmp_path, agent, "uac_transfer_hangup.xml")
    assert run.returncode == 0, sipp_log(tmp_path)
    (record,) = server.finished
    assert record.reason == "caller_hangup"
    assert record.report["call"]["transfer"]["result"] == "failed: the call ended before the target answered"
    assert record.duration_s < 20  # not held for sip.transfer_timeout_s (30 s) after the BYE

"""The SIP leg of bench/capacity.py: N simultaneous phone calls from sipp, heard on the wire.

For one round, every call of the round is dialled at once by its own sipp process (Debian
sip-tester, the `tests/sipp/uac_pcmu.xml` scenario): it offers PCMU, streams the call's audio
(8 kHz, G.711 mu-law, 20 ms RTP from a pcap) to one `voice.transports.sip.SipServer` in front of
the agent, listens, and hangs up. What each caller heard is taken from the wire, not from the
agent: the RTP on loopback is captured with kernel timestamps (`tests.sip_support.
LoopbackCapture`), the agent's packets to a caller are decoded and laid on that caller's
timeline (time 0: their first RTP packet, which carries sample 0 of the call), and the result is
judged against the call's ground truth exactly as `replay --concurrent` rounds are.

Needs root (sipp's pcap playback and the capture use raw sockets) and sipp on PATH.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.sip_support import (
    SCENARIOS,
    SIPP,
    LoopbackCapture,
    free_udp_port,
    free_udp_ports,
    run_sipp,
    sipp_log,
    write_rtp_pcap,
)
from voice.audio import read_wav
from voice.transports.sip.g711 import PCMU
from voice.transports.sip.rtp import RtpPacket

RATE = 8000
RTP_PORTS = (24000, 24999)  # the server's media ports, below Linux's ephemeral range (tests/test_sip_peer.py)
LISTEN_S = 1.0  # after the call's audio ends, before sipp hangs up (each call ends with 3.5 s for a reply)


class SipUnavailable(RuntimeError):
    pass


def check_available() -> None:
    if SIPP is None:
        raise SipUnavailable("sipp (Debian sip-tester) is not installed")
    if os.geteuid() != 0 or not LoopbackCapture.available():
        raise SipUnavailable("sipp's pcap playback and the loopback capture need root (CAP_NET_RAW)")


def heard(packets: list[Any], t0: float, n_samples: int) -> np.ndarray:
    """The agent's RTP to one caller as 8 kHz PCM on the caller's timeline (``t0``: the capture
    time of the caller's first packet), each packet placed at the time it went out."""
    out = np.zeros(n_samples, dtype=np.int16)
    for p in packets:
        pcm = PCMU.decode(RtpPacket.parse(p.payload).payload)
        i = int(round((p.t - t0) * RATE))
        if 0 <= i < n_samples:
            j = min(n_samples, i + len(pcm))
            out[i:j] = pcm[: j - i]
    return out


async def sip_round(agent: Any, calls: list[dict[str, Any]], work: Path) -> tuple[dict[str, np.ndarray], list[Any]]:
    """Dial every call of ``calls`` at once through sipp; returns {call id: the agent's audio as the
    caller heard it, 8 kHz} and the server's call records."""
    from pipelines.config import SipConfig
    from voice.transports.sip.server import SipServer

    # the agent's own sip settings (--config), on a free port and the bench's RTP range
    server = SipServer(agent, SipConfig(**{**agent.cfg.sip.model_dump(), "bind": "127.0.0.1:0",
                                           "rtp_ports": RTP_PORTS, "max_calls": None}))
    await server.start()
    dials = []
    taken = set(range(*RTP_PORTS))  # ports free now are not reserved: no two sipps may pick the same
    for c in calls:
        d = work / c["id"]
        d.mkdir(parents=True)
        pcm = read_wav(c["wav"], RATE)[0]
        packets = write_rtp_pcap(d / "speech.pcap", pcm, PCMU)
        while True:
            base = free_udp_ports(4)  # 8 free ports: sipp takes its media ports from here
            sip_port = free_udp_port()
            mine = {*range(base, base + 8), sip_port}
            if len(mine) == 9 and not mine & taken:
                break
        taken |= mine
        args = ["-sf", str(SCENARIOS / "uac_pcmu.xml"), "-m", "1", "-p", str(sip_port),
                "-mp", str(base), "-d", str(int(packets * 20 + LISTEN_S * 1000))]
        dials.append((c, d, range(base, base + 8), len(pcm), args))
    media = set(range(*RTP_PORTS)).union(*(r for _, _, r, _, _ in dials))
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # as `voice-agent serve sip` runs
    try:
        with LoopbackCapture(media) as cap:
            runs = await asyncio.gather(*(run_sipp((server.host, server.port), args, d, limit_s=120)
                                          for _, d, _, _, args in dials))
    finally:
        sys.setswitchinterval(switch)
        await server.close()
    out: dict[str, np.ndarray] = {}
    streams = cap.streams()
    for (c, d, ports, n, _), run in zip(dials, runs, strict=True):
        if run.returncode != 0:
            raise RuntimeError(f"sipp failed for {c['id']}: {sipp_log(d)[-2000:]}")
        caller = [p for (src, _), ps in streams.items() if src[1] in ports for p in ps]
        agent_rtp = [p for (src, dst), ps in streams.items() if dst[1] in ports and src[1] not in ports for p in ps]
        if not caller:
            raise RuntimeError(f"no RTP from the caller of {c['id']} was captured")
        out[c["id"]] = heard(agent_rtp, min(p.t for p in caller), n)
    return out, list(server.finished)

"""``voice-agent serve sip``: answer phone calls (SIP over UDP, RTP G.711) with the agent."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipelines.cli_serve import get_serve_subparsers, stop_on_signals
from pipelines.config import AgentConfig, ConfigError, SipConfig, load_config

log = logging.getLogger(__name__)

DESCRIPTION = """\
Answer phone calls over SIP (RFC 3261, UDP) with G.711 audio (PCMU/PCMA, 8 kHz, RTP) and
RFC 4733 / SIP INFO DTMF. Every call is its own session with the same turn-taking and
budgets as `voice-agent replay`. Point a softphone or a SIP trunk at HOST:PORT, e.g.
sip:agent@127.0.0.1:5070. By default only loopback sources may call (sip.allow in the
config, or --allow); other sources get 403. Calls beyond agent.max_calls (the agent's
capacity, shared with its other transports) or --max-calls get 486 Busy Here; while the box
is overloaded (agent.overload_*), new calls get 503 with Retry-After.
Settings not on the command line come from the `sip:` section of --config.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = get_serve_subparsers(subparsers)
    p = serve.add_parser(
        "sip",
        help="answer phone calls over SIP/RTP (G.711)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bind", metavar="HOST:PORT", help="UDP address for SIP (default: sip.bind, 127.0.0.1:5070)")
    p.add_argument("--max-calls", type=int, metavar="N",
                   help="this bridge's cap on concurrent calls before 486 Busy (default: agent.max_calls, 4)")
    p.add_argument("--allow", action="append", metavar="CIDR",
                   help="source network allowed to call; repeat for several (default: loopback only)")
    p.add_argument("--public-address", metavar="IP", help="address to advertise in SDP and Contact (NAT)")
    p.add_argument("--reports", metavar="DIR", help="write each finished call's report to DIR/<session>.json")
    p.add_argument("--config", metavar="PATH", help="YAML configuration file (default: built-in defaults)")
    p.add_argument("--mqtt", metavar="mqtt://HOST:PORT", help="publish events (DTMF included) to this MQTT broker")
    p.set_defaults(func=_run)


def configure(args: argparse.Namespace) -> AgentConfig:
    """The config file with the command-line overrides applied and validated."""
    config = load_config(args.config)
    overrides: dict[str, Any] = {}
    if args.bind is not None:
        overrides["bind"] = args.bind
    if args.max_calls is not None:
        overrides["max_calls"] = args.max_calls
    if args.allow:
        overrides["allow"] = args.allow
    if args.public_address is not None:
        overrides["public_address"] = args.public_address
    try:
        config.sip = SipConfig.model_validate({**config.sip.model_dump(), **overrides})
    except ValidationError as err:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'sip'}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"invalid SIP option: {msgs}") from None
    if args.mqtt:
        from pipelines.cli import apply_mqtt_url

        apply_mqtt_url(config, args.mqtt)
    return config


def _run(args: argparse.Namespace) -> int:
    try:
        config = configure(args)
    except ConfigError as exc:
        print(f"voice-agent serve sip: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sip_log = logging.getLogger("voice.sip")
    if sip_log.getEffectiveLevel() > logging.INFO:
        sip_log.setLevel(logging.INFO)  # one line per call answered and ended, even when the CLI is quiet
    try:
        return asyncio.run(serve(config, args.reports))
    except KeyboardInterrupt:
        return 0


async def serve(config: AgentConfig, reports: str | None = None) -> int:
    from pipelines.agent import Agent, start_event_bridge
    from voice.transports.sip.server import SipServer

    # A thread waiting for the GIL gets it after at most this long: the RTP pacer thread must not
    # wait the default 5 ms behind model code (measured: worst gap 12 ms -> 3 ms).
    sys.setswitchinterval(0.001)
    stop = stop_on_signals()
    agent = await Agent.load(config)
    server = SipServer(agent, config.sip, reports_dir=Path(reports) if reports else None)
    try:
        host, port = await server.start()
    except OSError as exc:
        print(f"voice-agent serve sip: cannot listen on udp {config.sip.bind}: {exc}", file=sys.stderr)
        await agent.aclose()
        return 1
    bridge = await start_event_bridge(agent, config)
    auth = "digest auth on" if server.auth else "no auth"
    cap = min(config.sip.max_calls or config.agent.max_calls, config.agent.max_calls)
    print(
        f"SIP bridge listening on udp {host}:{port} (sip:agent@{host}:{port}; max {cap} calls; "
        f"allow {', '.join(config.sip.allow)}; {auth})",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await server.close()
        if bridge is not None:
            await bridge.close()
        await agent.aclose()
    return 0


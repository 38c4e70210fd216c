"""``voice-agent livekit dev|start``: run the agent as a livekit-agents worker.

The worker registers with a LiveKit server; for each room it is dispatched to, a job joins
the room and runs our pipeline for one caller at a time (`entrypoint` here; the room transport
is voice/transports/livekit_room.py).
``dev`` is development mode (colored debug logs, no idle job processes kept warm); ``start``
is production mode. In both, the worker reports its load as running jobs (one caller each)
over ``agent.max_calls`` and takes no more jobs at that capacity (`CallLoad`).
Connection settings: ``--url/--api-key/--api-secret``, else ``livekit.url/api_key/api_secret``
in the config, else ``LIVEKIT_URL``, ``LIVEKIT_API_KEY``, ``LIVEKIT_API_SECRET``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from pipelines.config import AgentConfig, ConfigError, load_config

log = logging.getLogger(__name__)

# Loading Whisper, the LM and Piper takes 5-20 s on a busy 2-core machine; livekit-agents'
# default allows 10 s before it kills a job process that is still starting.
PROCESS_START_TIMEOUT_S = 180.0
CONFIG_ENV = "VOICE_AGENT_CONFIG_JSON"  # the worker's config, inherited by its job processes


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "livekit",
        help="run as a LiveKit agent worker (dev | start)",
        description=(
            "Run the voice agent as a livekit-agents worker. Each room job joins the room, talks to the first "
            "participant who publishes audio (or livekit.participant), and publishes the agent's voice. "
            "Needs a LiveKit server: for local development run `livekit-server --dev` and use "
            "--url ws://127.0.0.1:7880 --api-key devkey --api-secret secret."
        ),
    )
    modes = p.add_subparsers(dest="mode", metavar="MODE", required=True)
    for mode, text in (
        ("dev", "development mode: debug logs, job processes started on demand"),
        ("start", "production mode: info logs, load-based availability, a warm job process"),
    ):
        m = modes.add_parser(mode, help=text, description=f"Run the worker in {text}.")
        m.add_argument("--url", default=None, help="LiveKit server URL (else livekit.url, else $LIVEKIT_URL)")
        m.add_argument("--api-key", default=None, help="API key (else livekit.api_key, else $LIVEKIT_API_KEY)")
        m.add_argument(
            "--api-secret", default=None, help="API secret (else livekit.api_secret, else $LIVEKIT_API_SECRET)"
        )
        m.add_argument("--participant", default=None, help="only talk to this participant identity")
        m.add_argument("--agent-name", default="", help="register for explicit dispatch under this name")
        m.add_argument("--log-level", default=None, help="DEBUG, INFO, WARN, ERROR (default: DEBUG in dev)")
        m.add_argument("--config", metavar="PATH", default=None, help="YAML config file")
        m.add_argument("--mqtt", metavar="mqtt://HOST:PORT", default=None, help="publish events to this MQTT broker")
        m.set_defaults(func=_run)


def configure(args: argparse.Namespace, environ: dict[str, str] | None = None) -> AgentConfig:
    """The config with command-line flags and LIVEKIT_* variables applied; raises ConfigError
    naming what is missing."""
    env = os.environ if environ is None else environ
    cfg = load_config(args.config)
    lk = cfg.livekit
    lk.url = args.url or lk.url or env.get("LIVEKIT_URL")
    lk.api_key = args.api_key or lk.api_key or env.get("LIVEKIT_API_KEY")
    lk.api_secret = args.api_secret or lk.api_secret or env.get("LIVEKIT_API_SECRET")
    if args.participant:
        lk.participant = args.participant
    missing = [
        name for name, value in (("URL", lk.url), ("API key", lk.api_key), ("API secret", lk.api_secret)) if not value
    ]
    if missing:
        raise ConfigError(
            f"no LiveKit {', '.join(missing)}: pass --url/--api-key/--api-secret, set livekit.* in the config, "
            "or export LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET"
        )
    if not str(lk.url).startswith(("ws://", "wss://", "http://", "https://")):
        raise ConfigError(f"livekit.url must start with ws://, wss://, http:// or https://, got {lk.url!r}")
    if args.mqtt:
        from pipelines.mqtt import apply_mqtt_url

        cfg.mqtt = apply_mqtt_url(cfg.mqtt, args.mqtt)
    return cfg


# the livekit-agents job: runs in each job process the worker spawns


def job_config() -> AgentConfig:
    raw = os.environ.get(CONFIG_ENV)
    return AgentConfig.model_validate_json(raw) if raw else AgentConfig()


def prewarm(proc: Any) -> None:
    """livekit-agents ``setup_fnc``: each job process loads the engines once, before any job."""
    from pipelines.agent import load_engines

    cfg = job_config()
    proc.userdata["config"] = cfg
    proc.userdata["engines"] = load_engines(cfg)


async def entrypoint(ctx: Any) -> None:
    """livekit-agents job: join the room, talk to one caller at a time until the room closes."""
    from livekit.agents import AutoSubscribe

    from pipelines.agent import Agent, load_engines, start_event_bridge
    from voice.transports.livekit_room import RoomAgent

    cfg = ctx.proc.userdata.get("config") or job_config()
    engines = ctx.proc.userdata.get("engines") or await asyncio.to_thread(load_engines, cfg)
    agent = Agent(cfg, engines)
    await ctx.connect(auto_subscribe=AutoSubscribe.AUDIO_ONLY)
    room_agent = RoomAgent(
        ctx.room,
        agent,
        participant=cfg.livekit.participant,
        asr_rate=cfg.audio.asr_rate,
        buffer_s=cfg.output.buffer_ms / 1000,
        rejoin_grace_s=cfg.livekit.rejoin_grace_s,
    )
    bridge = await start_event_bridge(agent, cfg)

    async def _shutdown(reason: str) -> None:
        await room_agent.aclose()
        if bridge is not None:
            await bridge.close()

    ctx.add_shutdown_callback(_shutdown)
    await room_agent.start()
    log.info("joined room %s", ctx.room.name)
    await room_agent.closed.wait()


class CallLoad:
    """livekit-agents ``load_fnc``: live calls over ``agent.max_calls``. Each job is one room
    with one caller at a time, so the worker's running jobs are its live calls."""

    def __init__(self, max_calls: int) -> None:
        self.max_calls = max_calls

    def __call__(self, server: Any) -> float:
        return min(1.0, len(server.active_jobs) / self.max_calls)

    @property
    def threshold(self) -> float:
        """Full once max_calls jobs run, available below: halfway between the last two steps
        (and below 1, which production mode requires)."""
        return (self.max_calls - 0.5) / self.max_calls


def build_server(cfg: AgentConfig, agent_name: str = "", dev: bool = False) -> Any:
    """An ``AgentServer`` whose job processes load our engines once and run `entrypoint`."""
    from livekit.agents import AgentServer

    os.environ[CONFIG_ENV] = cfg.model_dump_json()  # job processes are spawned: they read it back
    kwargs: dict[str, Any] = {
        "setup_fnc": prewarm,
        "initialize_process_timeout": PROCESS_START_TIMEOUT_S,
        "job_memory_warn_mb": 3000,
        "ws_url": cfg.livekit.url,
        "api_key": cfg.livekit.api_key,
        "api_secret": cfg.livekit.api_secret,
    }
    if not dev:
        kwargs["num_idle_processes"] = 1  # each process holds all three models
    load = CallLoad(cfg.agent.max_calls)
    kwargs["load_fnc"] = load  # the server stops offering this worker jobs at agent.max_calls
    kwargs["load_threshold"] = load.threshold
    server = AgentServer(**kwargs)
    server.rtc_session(entrypoint, agent_name=agent_name)
    return server


def _run(args: argparse.Namespace) -> int:
    try:
        cfg = configure(args)
    except ConfigError as exc:
        print(f"voice-agent livekit: {exc}", file=sys.stderr)
        return 2
    from livekit.agents.cli import proto
    from livekit.agents.cli.cli import _run_worker  # the runner behind `python -m livekit.agents start`

    dev = args.mode == "dev"
    server = build_server(cfg, args.agent_name, dev)
    _run_worker(
        server,
        proto.CliArgs(
            log_level=args.log_level or ("DEBUG" if dev else "INFO"),
            url=cfg.livekit.url,
            api_key=cfg.livekit.api_key,
            api_secret=cfg.livekit.api_secret,
            log_format="colored" if dev else "json",
            dev=dev,
        ),
    )
    return 0

"""`voice-agent` command line."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pipelines.allocator import tune_allocator
from pipelines.config import AgentConfig, ConfigError, load_config
from voice.audio import AudioInputError

# Modules that add their own subcommands through `register(subparsers)`.
PLUGIN_COMMANDS = (
    "pipelines.report_view", "pipelines.reply_cli", "pipelines.serve_sip", "pipelines.serve_webrtc",
    "pipelines.serve_livekit",
)


def apply_mqtt_url(cfg: AgentConfig, url: str | None) -> None:
    """``--mqtt mqtt://HOST:PORT`` overrides the broker in the config."""
    if url:
        from pipelines.mqtt import apply_mqtt_url as parse

        cfg.mqtt = parse(cfg.mqtt, url)


def _inputs(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(x for x in p.iterdir() if x.suffix.lower() in (".wav", ".flac", ".ogg")))
        else:
            out.append(p)
    return out


async def _replay_concurrent(args: argparse.Namespace) -> int:
    from pipelines.agent import Agent, start_event_bridge
    from pipelines.replay_concurrent import load_inputs, replay_concurrent

    cfg = load_config(args.config)
    apply_mqtt_url(cfg, args.mqtt)
    if args.max_calls is not None:
        cfg.agent.max_calls = args.max_calls
    calls = load_inputs(_inputs(args.inputs))  # every input is read before any model loads
    agent = await Agent.load(cfg)
    bridge = await start_event_bridge(agent, cfg)
    try:
        summary = await replay_concurrent(agent, calls, Path(args.out), Path(args.report), fast=args.fast)
    finally:
        if bridge is not None:
            await bridge.close()
        await agent.aclose()
    print(json.dumps(summary, indent=2))
    for r in summary["refused"]:
        print(f"voice-agent: call {r['call']} refused ({r['detail']})", file=sys.stderr)
    for f in summary["failed"]:
        print(f"voice-agent: error: call {f['call']} failed: {f['error']}", file=sys.stderr)
    return 1 if summary["failed"] else 0


async def _replay(args: argparse.Namespace) -> int:
    from pipelines.agent import Agent, start_event_bridge
    from pipelines.replay import replay_file
    from voice.audio import read_wav

    if args.concurrent:
        return await _replay_concurrent(args)
    cfg = load_config(args.config)
    apply_mqtt_url(cfg, args.mqtt)
    inputs = _inputs(args.inputs)
    for p in inputs:  # reject bad input before loading any model
        read_wav(p)
    multi = len(inputs) > 1
    agent = await Agent.load(cfg)
    bridge = await start_event_bridge(agent, cfg)
    reports: list[dict[str, Any]] = []
    try:
        progress = _progress(multi)
        with progress:
            task = progress.add_task("replaying", total=len(inputs))
            for p in inputs:
                out = Path(args.out) / f"{p.stem}.out.wav" if multi else Path(args.out)
                rep = await replay_file(agent, p, out, fast=args.fast)
                rep["call"]["config"] = cfg.model_dump(mode="json")
                _write_json(Path(args.report) / f"{p.stem}.json" if multi else Path(args.report), rep)
                reports.append(rep)
                progress.advance(task)
    finally:
        if bridge is not None:
            await bridge.close()
        await agent.aclose()
    if multi:
        from pipelines.report import summarize

        all_turns = [t for r in reports for t in r["turns"]]
        summary = {"calls": len(reports), **summarize(all_turns)}
        _write_json(Path(args.report) / "summary.json", summary)
        print(json.dumps(summary, indent=2))
    else:
        print(json.dumps(reports[0]["summary"], indent=2))
    return 0


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2))


def _progress(enabled: bool) -> Any:
    from rich.progress import Progress

    return Progress(disable=not enabled, transient=False)


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of calls, at least 1: {value!r}")
    return n


def _run_replay(args: argparse.Namespace) -> int:
    if args.max_calls is not None and not args.concurrent:
        raise ConfigError("--max-calls applies to --concurrent replays only")
    if args.concurrent:
        for flag, value in (("--out", args.out), ("--report", args.report)):
            if Path(value).exists() and not Path(value).is_dir():
                raise ConfigError(f"with --concurrent, {flag} names a folder; {value} is a file")
            Path(value).mkdir(parents=True, exist_ok=True)
    elif len(_inputs(args.inputs)) > 1:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    return asyncio.run(_replay(args))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="voice-agent",
        description="Low-latency voice agent: streaming Whisper ASR, a diffusion LM and Piper TTS.",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="log debug information")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    rp = sub.add_parser(
        "replay",
        help="replay a recorded call through the agent",
        description="Replay recorded caller audio through the full pipeline (VAD, ASR, diffusion LM, TTS) and "
        "write a two-channel OUT.wav aligned with the input (0: caller, 1: agent as heard) and a per-turn "
        "latency report.",
    )
    rp.add_argument("inputs", nargs="+", metavar="IN.wav",
                    help="caller audio: any rate (8/16/44.1/48 kHz), mono or stereo (mixed down); several files "
                    "or a folder replay one call each, and then --out and --report name folders")
    rp.add_argument("--out", required=True, metavar="OUT.wav", help="two-channel output WAV (or folder)")
    rp.add_argument("--report", required=True, metavar="REPORT.json", help="per-turn report JSON (or folder)")
    rp.add_argument("--config", metavar="config.yaml", help="configuration file (default: built-in defaults)")
    rp.add_argument("--fast", action="store_true",
                    help="feed frames as fast as the pipeline takes them (functional tests); default is real-time "
                    "pace, 20 ms frames on a real clock, so latencies are what a caller gets")
    rp.add_argument("--mqtt", metavar="mqtt://HOST:PORT", help="publish events to this MQTT broker")
    rp.add_argument("--concurrent", action="store_true",
                    help="replay all inputs at once, as simultaneous calls on one agent (engines shared, each call "
                    "paced in real time): writes OUT/<stem>.out.wav, REPORT/<stem>.json and REPORT/summary.json "
                    "(per call: turns, gap p50/p95, violations; overall; CPU and memory)")
    rp.add_argument("--max-calls", type=_positive_int, metavar="N",
                    help="with --concurrent: admit at most N calls at once (default: agent.max_calls); the "
                    "rest are refused as a phone call would be, reported in REPORT/<stem>.json and summary.json")
    rp.set_defaults(func=_run_replay)
    for mod in PLUGIN_COMMANDS:
        try:
            module = importlib.import_module(mod)
        except ImportError as exc:
            logging.getLogger(__name__).debug("%s unavailable: %s", mod, exc)
            continue
        module.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    tune_allocator()  # before the engines' threads exist
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # transformers' "Loading weights" bar, before it is imported
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (AudioInputError, ConfigError) as exc:
        print(f"voice-agent: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"voice-agent: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

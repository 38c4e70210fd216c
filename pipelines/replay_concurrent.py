"""``voice-agent replay --concurrent``: several recorded calls replayed at once, as simultaneous
callers of one agent (engines loaded once and shared, each call paced on its own real-time
clock), so what one call costs the others shows in their gaps."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.replay import replay_pcm, write_two_channel
from pipelines.report import summarize
from voice.audio import AudioInputError, read_wav


@dataclass(frozen=True)
class CallInput:
    name: str  # the input's stem: DIR/<name>.out.wav, DIR/<name>.json
    path: Path
    pcm: np.ndarray
    rate: int


def load_inputs(paths: list[Path]) -> list[CallInput]:
    """Read every input before any call starts; a missing, corrupt or duplicate-named one
    raises AudioInputError naming it."""
    calls: list[CallInput] = []
    seen: dict[str, Path] = {}
    for p in paths:
        if p.stem in seen:
            raise AudioInputError(f"{p} and {seen[p.stem]} would both write {p.stem}.out.wav: rename one")
        seen[p.stem] = p
        pcm, rate = read_wav(p)
        calls.append(CallInput(p.stem, p, pcm, rate))
    return calls


def call_summary(name: str, report: dict[str, Any]) -> dict[str, Any]:
    s = report["summary"]
    return {"call": name, "turns": s["turns"], "answered": s["answered"], "gap_p50_ms": s["gap_p50_ms"],
            "gap_p95_ms": s["gap_p95_ms"], "violations": s["violations"]}


async def replay_concurrent(
    agent: Any, calls: list[CallInput], out_dir: Path, report_dir: Path, fast: bool = False
) -> dict[str, Any]:
    """Replay `calls` at once; write each call's OUT.wav and report, and summary.json (the
    folders exist). Files are written in a worker thread: the other calls are still live."""
    cpu0, t0 = time.process_time(), time.monotonic()

    async def one(call: CallInput) -> dict[str, Any]:
        report, track = await replay_pcm(agent, call.pcm, call.rate, fast=fast)
        report["call"]["input"] = str(call.path)
        report["call"]["input_duration_s"] = round(len(call.pcm) / call.rate, 3)
        report["call"]["concurrent_calls"] = len(calls)
        report["call"]["config"] = agent.cfg.model_dump(mode="json")
        await asyncio.to_thread(_write_call, call, report, track, out_dir, report_dir)
        return report

    results = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
    wall = time.monotonic() - t0
    per_call, all_turns, failed = [], [], []
    for call, res in zip(calls, results, strict=True):
        if isinstance(res, BaseException):
            failed.append({"call": call.name, "error": f"{type(res).__name__}: {res}"})
            continue
        per_call.append(call_summary(call.name, res))
        all_turns.extend(res["turns"])
    summary = {
        "calls": len(calls),
        "mode": "fast" if fast else "realtime",
        "per_call": per_call,
        "failed": failed,
        "overall": summarize(all_turns),
        "wall_s": round(wall, 2),
        "cpu": round((time.process_time() - cpu0) / wall, 3) if wall > 0 else None,  # cores busy on average
        "rss_mb": round(current_rss_mb(), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    await asyncio.to_thread((report_dir / "summary.json").write_text, json.dumps(summary, indent=2))
    return summary


def _write_call(call: CallInput, report: dict[str, Any], track: np.ndarray, out_dir: Path, report_dir: Path) -> None:
    write_two_channel(out_dir / f"{call.name}.out.wav", call.pcm, track, call.rate)
    (report_dir / f"{call.name}.json").write_text(json.dumps(report, indent=2))


def current_rss_mb() -> float:
    """Resident memory now (Linux /proc), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

"""``voice-agent replay --concurrent``: several recorded calls replayed at once, as simultaneous
callers of one agent (engines loaded once and shared, each call paced on its own real-time
clock), so what one call costs the others shows in their gaps.

Each call asks the agent's admission for a seat before it starts, as a phone or browser call
does (`pipelines.admission`): beyond ``agent.max_calls`` (or when the box is overloaded) the
call is refused, as SIP answers 486 or 503, and its refusal is reported instead of a
half-served call. ``admit=False`` (`bench/capacity.py`, past capacity on purpose) serves all."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.admission import Seat
from pipelines.replay import replay_pcm, write_two_channel
from pipelines.report import summarize
from voice.audio import AudioInputError, read_wav
from voice.transports.base import Refusal


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
    agent: Any, calls: list[CallInput], out_dir: Path, report_dir: Path, fast: bool = False, admit: bool = True,
) -> dict[str, Any]:
    """Replay `calls` at once; write each admitted call's OUT.wav and report, and summary.json
    (the folders exist). Calls are admitted in the order given; a refused one gets
    REPORT/<stem>.json with its refusal and no OUT.wav. Files are written in a worker thread:
    the other calls are still live."""
    cpu0, t0 = time.process_time(), time.monotonic()
    seats: dict[str, Seat | None] = {}
    refused: list[dict[str, Any]] = []
    for call in calls:
        got = agent.admit("replay") if admit else None
        if isinstance(got, Refusal):
            refused.append(refusal_report(call, got))
        else:
            seats[call.name] = got
    for r in refused:
        await asyncio.to_thread((report_dir / f"{r['call']}.json").write_text, json.dumps(r, indent=2))
    admitted = [c for c in calls if c.name in seats]

    async def one(call: CallInput) -> dict[str, Any]:
        report, track = await replay_pcm(agent, call.pcm, call.rate, fast=fast, seat=seats[call.name])
        report["call"]["input"] = str(call.path)
        report["call"]["input_duration_s"] = round(len(call.pcm) / call.rate, 3)
        report["call"]["concurrent_calls"] = len(admitted)
        report["call"]["config"] = agent.cfg.model_dump(mode="json")
        await asyncio.to_thread(_write_call, call, report, track, out_dir, report_dir)
        return report

    results = await asyncio.gather(*(one(c) for c in admitted), return_exceptions=True)
    wall = time.monotonic() - t0
    per_call, all_turns, failed = [], [], []
    for call, res in zip(admitted, results, strict=True):
        if isinstance(res, BaseException):
            failed.append({"call": call.name, "error": f"{type(res).__name__}: {res}"})
            continue
        per_call.append(call_summary(call.name, res))
        all_turns.extend(res["turns"])
    summary = {
        "calls": len(calls),
        "mode": "fast" if fast else "realtime",
        "admitted": len(admitted),
        "per_call": per_call,
        "refused": refused,
        "failed": failed,
        "overall": summarize(all_turns),
        "wall_s": round(wall, 2),
        "cpu": round((time.process_time() - cpu0) / wall, 3) if wall > 0 else None,  # cores busy on average
        "rss_mb": round(current_rss_mb(), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    await asyncio.to_thread((report_dir / "summary.json").write_text, json.dumps(summary, indent=2))
    return summary


def refusal_report(call: CallInput, refusal: Refusal) -> dict[str, Any]:
    """What a refused call gets: why, and when to try again (SIP: 486 or 503, Retry-After)."""
    return {"call": call.name, "input": str(call.path),
            "refused": "busy" if refusal.busy else "overloaded", "detail": refusal.detail,
            "retry_after_s": refusal.retry_after_s}


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

"""Soak: many calls on one agent for a long time, looking for what leaks.

    python bench/soak.py [--minutes 10] [--calls 4] [--vanish-every-s 60] [--json PATH]

``--calls`` calls run at once on one agent, each a call of the evaluation set replayed at
real-time pace (`pipelines.replay.replay_pcm`); when one ends the next starts, so calls end
and start all the time. Every ``--vanish-every-s`` one caller vanishes mid-call (no more
audio; the session is closed as a transport closes it when its peer is gone). Once a minute,
and at the end after the last call has closed, it samples resident memory, asyncio tasks,
threads, open file descriptors, the agent's live sessions and seats. Reported: RSS growth from
the first sample (after the first minute's warm-up) to the last, and what is left at the end
beyond what was there before the first call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def sample(agent: Any) -> dict[str, Any]:
    from pipelines.replay_concurrent import current_rss_mb

    return {"rss_mb": round(current_rss_mb(), 1), "tasks": len(asyncio.all_tasks()),
            "threads": threading.active_count(), "fds": len(os.listdir("/proc/self/fd")),
            "sessions": len(agent.sessions), "seats": agent.admission.live}


async def soak(agent: Any, calls: list[tuple[str, Any, int]], duration_s: float, concurrent: int,
               vanish_every_s: float, sample_every_s: float = 60.0) -> dict[str, Any]:
    """Run the soak; `calls` are (name, int16 pcm, rate), used round-robin."""
    from pipelines.replay import replay_pcm

    before = sample(agent)
    t0 = time.monotonic()
    state = {"next": 0, "started": 0, "ended": 0, "vanished": 0, "answered": 0, "reports": 0, "errors": [],
             "next_vanish": t0 + vanish_every_s}
    samples: list[dict[str, Any]] = []

    async def line() -> None:
        while time.monotonic() - t0 < duration_s:
            name, pcm, rate = calls[state["next"] % len(calls)]
            state["next"] += 1
            state["started"] += 1
            vanish = None
            if time.monotonic() >= state["next_vanish"]:  # this caller will vanish halfway
                state["next_vanish"] += vanish_every_s
                vanish = len(pcm) / rate / 2
            try:
                report, _ = await replay_pcm(agent, pcm, rate, vanish_at_s=vanish)
                if "turns" in report and "summary" in report:
                    state["reports"] += 1
                state["answered"] += report["summary"]["answered"]
                state["vanished" if vanish is not None else "ended"] += 1
            except Exception as exc:  # a failed call is a finding, not the end of the soak
                state["errors"].append(f"{name}: {type(exc).__name__}: {exc}")

    async def sampler() -> None:
        while True:
            await asyncio.sleep(sample_every_s)
            samples.append({"t_s": round(time.monotonic() - t0, 1), **sample(agent)})

    watch = asyncio.ensure_future(sampler())
    await asyncio.gather(*(line() for _ in range(concurrent)))
    watch.cancel()
    await asyncio.sleep(0.5)  # let closed calls' last callbacks run
    after = {"t_s": round(time.monotonic() - t0, 1), **sample(agent)}
    base = samples[0] if samples else before
    growth_pct = 100.0 * (after["rss_mb"] - base["rss_mb"]) / base["rss_mb"]
    # the engines' worker pools start their (bounded) threads on first use: threads are
    # counted from the warm-up sample, everything else from before the first call
    leaked = {k: after[k] - before[k] for k in ("tasks", "fds", "sessions", "seats")}
    leaked["threads_since_warmup"] = after["threads"] - base["threads"]
    return {
        "minutes": round((time.monotonic() - t0) / 60, 2), "concurrent": concurrent,
        "calls_started": state["started"], "calls_ended": state["ended"], "calls_vanished": state["vanished"],
        "replies": state["answered"], "errors": state["errors"],
        "before": before, "samples": samples, "after": after,
        "reports": state["reports"],
        "rss_growth_mb": round(after["rss_mb"] - base["rss_mb"], 1), "rss_growth_pct": round(growth_pct, 1),
        "leaked": leaked,
        # the bar: RSS grows at most 5 % after warm-up, nothing is left behind, every
        # call (vanished ones too) gets its report, and no call failed
        "holds": growth_pct <= 5.0 and not any(leaked.values()) and state["reports"] == state["started"]
                 and not state["errors"],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from eval_calls import load_calls

    from pipelines.agent import Agent
    from pipelines.config import AgentConfig, load_config
    from voice.audio import read_wav

    cfg = load_config(args.config) if args.config else AgentConfig()
    cfg.cache.enabled = False
    agent = await Agent.load(cfg)
    calls = [(c["id"], *read_wav(c["wav"])) for c in load_calls(args.split)]
    try:
        return await soak(agent, calls, args.minutes * 60, args.calls, args.vanish_every_s)
    finally:
        await agent.aclose()


def main() -> None:
    from pipelines.allocator import tune_allocator

    tuned = tune_allocator()  # as the voice-agent CLI does, before the engines' threads exist
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--calls", type=int, default=4, help="calls at once")
    ap.add_argument("--vanish-every-s", type=float, default=60.0, help="a caller vanishes mid-call this often")
    ap.add_argument("--split", default="test", choices=("dev", "test"))
    ap.add_argument("--config")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = asyncio.run(run(args))
    out["allocator_tuned"] = tuned
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

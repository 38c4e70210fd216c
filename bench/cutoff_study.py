"""Where our cut-offs come from: every agent onset inside a caller's turn, with what the caller
and the session were doing around it.

    python bench/cutoff_study.py [--split dev] [--calls N] --out DIR        # replay and record
    python bench/cutoff_study.py --from DIR                                  # study a recording

The replay (real-time pace, default config, as bench/turn_gap.py) keeps, per call, the agent's
track, the report and the session's events (speech starts, pauses, endpoint decisions,
interruptions) under DIR, so the study can be rerun without replaying. For each cut-off it
prints the kind (`bench/turn_gap.judge`), how long after the caller last resumed speaking the
onset fell (from the truth's pause ends), the session's last endpoint decision before it and
the VAD's last speech start before and first after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from eval_calls import load_calls  # noqa: E402
from turn_gap import onset_kind  # noqa: E402

from tests.ground_truth import audible_onsets  # noqa: E402
from voice.audio import read_wav  # noqa: E402


async def record(split: str, calls_n: int, out: Path) -> None:
    from pipelines.agent import Agent
    from pipelines.config import AgentConfig
    from pipelines.replay import replay_pcm

    cfg = AgentConfig()
    cfg.cache.enabled = False
    agent = await Agent.load(cfg)
    events: list[dict[str, Any]] = []
    agent.bus.add_listener(lambda ev: events.append(
        {"kind": ev.kind, "t": getattr(ev, "t", None), "reason": getattr(ev, "reason", None),
         "silence_ms": getattr(ev, "silence_ms", None)}))
    for call in load_calls(split)[: calls_n or None]:
        events.clear()
        pcm, rate = read_wav(call["wav"])
        report, track = await replay_pcm(agent, pcm, rate, fast=False)
        np.save(out / f"{call['id']}.track.npy", track)
        (out / f"{call['id']}.json").write_text(json.dumps(
            {"rate": rate, "truth": call["truth"], "report": report, "events": list(events)}, default=str))
        print(call["id"], flush=True)
    await agent.aclose()


def study(src: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted(src.glob("*.json")):
        rec = json.loads(f.read_text())
        rate, turns, evs = rec["rate"], rec["truth"]["turns"], rec["events"]
        track = np.load(f.with_suffix("").with_suffix(".track.npy"))
        onsets = audible_onsets(track, rate)
        starts = [e["t"] for e in evs if e["kind"] == "speech_start" and e["t"] is not None]
        for i, turn in enumerate(turns):
            inside = [o for o in onsets if turn["start_s"] + 0.05 < o < turn["end_s"]]
            for o in inside:
                kind = onset_kind(o, turn)
                paused = [p for p in turn["pauses"] if p["end_s"] <= o]
                resumed = paused[-1]["end_s"] if paused else turn["start_s"]
                ends = [e for e in evs if e["kind"] == "endpoint" and e["t"] is not None and e["t"] <= o]
                rows.append({
                    "call": f.stem, "turn": i, "kind": kind, "onset_s": round(o, 3),
                    "after_resume_ms": None if kind != "speech" else round((o - resumed) * 1000),
                    "last_pause_ms": round((paused[-1]["end_s"] - paused[-1]["start_s"]) * 1000) if paused else None,
                    "last_pause_kind": paused[-1]["kind"] if paused else None,
                    "endpoint": ends[-1] if ends else None,
                    "vad_start_before_ms": round((o - max([s for s in starts if s <= o], default=-1e9)) * 1000),
                    "vad_start_after_ms": round((min([s for s in starts if s > o], default=1e9) - o) * 1000),
                })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="dev", choices=("dev", "test"))
    ap.add_argument("--calls", type=int, default=0)
    ap.add_argument("--out", type=Path, help="replay the split and record it here")
    ap.add_argument("--from", dest="src", type=Path, help="study a recording made with --out")
    args = ap.parse_args()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        asyncio.run(record(args.split, args.calls, args.out))
    for row in study(args.src or args.out):
        print(json.dumps(row))


if __name__ == "__main__":
    main()

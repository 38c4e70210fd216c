"""Medians of several `bench/turn_gap.py` or `bench/capacity.py` runs.

    python bench/median_runs.py bench/results/turn_gap_cpu_run{1,2,3}.json [--json OUT]
    python bench/median_runs.py bench/results/capacity_cpu_run{1,2,3}.json [--json OUT]

A turn-gap run's JSON has a block per system ("ours", "livekit", "pipecat", whichever it
ran). For every number a block holds, the output gives the runs' values and their median, and
the ratio of p50s of each run (ours / the peer's, taken in the same run, so the machine's load
cancels) with its median. A capacity run has a curve per leg (replay, and "sip" when it ran):
the same, per number of calls at once, and the capacity each run found. Runs on different
splits or machines, or of different benches, are refused.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

SYSTEMS = ("ours", "livekit", "pipecat")
RATIOS = {"livekit": "ratio_p50", "pipecat": "ratio_p50_pipecat"}
CURVE_SHOWN = ("p50_ms", "p95_ms", "cutoffs", "missed", "turns", "cpu", "rss_mb")


def load_runs(paths: list[Path]) -> list[dict[str, Any]]:
    runs = [json.loads(p.read_text()) for p in paths]
    for key in ("split", "machine"):
        seen = {str(r.get(key)) for r in runs}
        if len(seen) > 1:
            raise ValueError(f"runs differ in {key}: {sorted(seen)}")
    if len({"curve" in r for r in runs}) > 1:
        raise ValueError("runs mix turn-gap and capacity results")
    for key in ("calls_per_level", "same_calls"):
        seen = {str(r.get(key)) for r in runs if "curve" in r}
        if len(seen) > 1:
            raise ValueError(f"runs differ in {key}: {sorted(seen)}")
    return runs


def _figures(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """{key: {"runs", "median"}} for every number the first block holds and all blocks have."""
    figures: dict[str, Any] = {}
    for key, value in blocks[0].items():
        values = [b.get(key) for b in blocks]
        if isinstance(value, bool) or not all(isinstance(v, int | float) for v in values):
            continue
        figures[key] = {"runs": values, "median": statistics.median(values)}
    return figures


def curve_medians(curves: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per number of calls at once that every run measured: each figure's runs and median."""
    levels = sorted(set.intersection(*({row["calls"] for row in c} for c in curves)))
    return [_figures([next(row for row in c if row["calls"] == n) for c in curves]) for n in levels]


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(runs), "split": runs[0].get("split"), "machine": runs[0].get("machine")}
    if "curve" in runs[0]:
        out["cores"] = runs[0].get("cores")
        out["curve"] = curve_medians([r["curve"] for r in runs])
        out["capacity"] = {"runs": [r["capacity"] for r in runs]}
        if all(isinstance(r.get("sip"), dict) for r in runs):
            out["sip"] = {"curve": curve_medians([r["sip"]["curve"] for r in runs]),
                          "capacity": {"runs": [r["sip"]["capacity"] for r in runs]}}
        return out
    for system in SYSTEMS:
        blocks = [r[system] for r in runs if isinstance(r.get(system), dict)]
        if blocks:
            out[system] = _figures(blocks)
    for peer, key in RATIOS.items():
        values = [r[key] for r in runs if isinstance(r.get(key), int | float)]
        if values:
            out[key] = {"runs": values, "median": statistics.median(values), "peer": peer}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path,
                    help="JSON files written by bench/turn_gap.py --json or bench/capacity.py --json")
    ap.add_argument("--json", type=Path, help="write the medians here")
    args = ap.parse_args(argv)
    try:
        result = medians(load_runs(args.runs))
    except (OSError, ValueError, KeyError) as exc:
        print(f"median_runs: {exc}", file=sys.stderr)
        return 2
    if "curve" in result:
        for leg, block in (("replay", result), ("sip", result.get("sip"))):
            if block is None:
                continue
            for row in block["curve"]:
                cells = [f"{k} {row[k]['median']:g} {row[k]['runs']}" for k in CURVE_SHOWN if k in row]
                print(f"{leg} {row['calls']['median']:g} at once: " + "; ".join(cells))
            print(f"{leg} capacity: {block['capacity']['runs']}")
    shown = ("p50_ms", "p95_ms", "cutoffs", "joins_talked_over", "overlap_max_ms", "missed", "final_transcript_wer")
    for system in SYSTEMS:
        if system not in result:
            continue
        figures = result[system]
        cells = [f"{k} {figures[k]['median']:g} {figures[k]['runs']}" for k in shown if k in figures]
        print(f"{system}: " + "; ".join(cells))
    for key in RATIOS.values():
        if key in result:
            print(f"{key}: {result[key]['median']:.3f} {result[key]['runs']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

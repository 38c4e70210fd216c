"""Capacity: how many simultaneous calls one box holds before callers hear it.

    python bench/capacity.py [--levels 1 2 3 4] [--calls-per-level 8] [--split test] [--json PATH]
                             [--plot PATH.svg] [--sip] [--same-calls] [--keep DIR]
    python bench/capacity.py --plot-medians MEDIANS.json --plot PATH.svg   # draw bench/median_runs.py's medians

For each level N, rounds of N calls from the evaluation set (`bench/eval_calls.py`) are
replayed at once through ``voice-agent replay --concurrent`` (`pipelines.replay_concurrent`,
one agent, engines loaded once and shared, every call on its own real-time clock) until
``--calls-per-level`` calls have been heard. Each call's agent channel (channel 1 of its
OUT.wav) is judged against the call's ground truth exactly as bench/turn_gap.py does:

- gap: from a turn's true end to the first audible agent onset after it;
- cut-off: an agent onset inside a turn (mid-sentence pause or speech; joins are not counted);
- missed: a turn with no agent onset before the next turn.

Per level: p50/p95 gap, cut-offs, missed, CPU (process time over wall time: the cores in use
on average) and resident memory at the end of the level's rounds. The capacity is the largest
N whose p95 gap is at most ``--p95-ms`` (350) with no cut-offs, every smaller level holding too.

``--sip`` also dials the same rounds as phone calls: one sipp per call streams it as PCMU to the
SIP bridge in front of the same agent, and what each caller heard is judged from the RTP captured
on loopback (bench/capacity_sip.py; root and sipp needed). The JSON then has ``"sip": {"curve",
"capacity"}`` beside the replay leg's ``"curve"`` and ``"capacity"``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import machine  # noqa: E402
from eval_calls import load_calls  # noqa: E402
from turn_gap import caller_levels, cut_kinds, judge, summary  # noqa: E402


def rounds_for(calls: list[dict[str, Any]], n: int, per_level: int, offset: int = 0) -> list[list[dict[str, Any]]]:
    """Rounds of `n` distinct calls, cycling through the set, until `per_level` calls are covered."""
    rounds, k = [], offset
    while sum(len(r) for r in rounds) < per_level:
        rounds.append([calls[(k + i) % len(calls)] for i in range(n)])
        k += n
    return rounds


def judge_round(calls: list[dict[str, Any]], out_dir: Path) -> list[dict[str, Any]]:
    judged = []
    for call in calls:
        data, rate = sf.read(out_dir / f"{call['id']}.out.wav", dtype="int16")
        judged += judge(data[:, 1], rate, call["truth"]["turns"], call.get("caller_db"))
    return judged


def largest_holding(curve: list[dict[str, Any]], p95_ms: float) -> int:
    """The largest N that holds, with every smaller level tried holding too (a noisy pass above a
    failing level is not capacity)."""
    best = 0
    for row in sorted(curve, key=lambda r: r["calls"]):
        if row["p95_ms"] is None or row["p95_ms"] > p95_ms or row["cutoffs"] > 0:
            break
        best = row["calls"]
    return best


async def replay_round(
    agent: Any, rnd: list[dict[str, Any]], keep: Path | None = None
) -> tuple[list[dict[str, Any]], int]:
    """One round through `replay --concurrent`: the calls judged from their OUT.wav, and the
    violations. ``keep``: a folder to leave each call's OUT.wav and report in."""
    from pipelines.replay_concurrent import CallInput, replay_concurrent
    from voice.audio import read_wav

    inputs = []
    for c in rnd:
        pcm, rate = read_wav(c["wav"])
        inputs.append(CallInput(c["id"], Path(c["wav"]), pcm, rate))
    with tempfile.TemporaryDirectory() as tmp:
        out = keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        s = await replay_concurrent(agent, inputs, out, out, admit=False)  # the curve goes past capacity
        (out / "summary.json").unlink(missing_ok=True)  # the next round's would replace it
        return judge_round(rnd, out), s["overall"]["violations"]


async def until_admitting(agent: Any, limit_s: float = 15.0) -> None:
    """Wait until the agent would take a phone call: no call still live, and no event-loop lag
    or engine queue that its admission reads as overload (agent.overload_lag_ms looks back
    agent.overload_window_s, and the bench has just decoded the last round's RTP on the loop).
    A round must start on an idle box: a refused INVITE (486/503) stops the run. One run stopped
    so at its first SIP round of 4 (sipp: "unexpected message"), before this wait; the cause
    was not established, and in the next run the wait was never needed."""
    adm, cfg = agent.admission, agent.cfg.agent
    adm.lag.ensure_running()
    t0 = time.monotonic()
    while True:
        state = {"live": adm.live, "lag_ms": round(adm.lag.worst_ms()), "queue": adm.queue_depth()}
        if state["live"] == 0 and state["lag_ms"] <= cfg.overload_lag_ms and state["queue"] <= cfg.overload_queue:
            break
        if time.monotonic() - t0 > limit_s:
            print(f"the agent is still not admitting after {limit_s:.0f} s: {state}", flush=True)
            return
        await asyncio.sleep(0.1)
    waited = time.monotonic() - t0
    if waited > 0.05:
        print(f"waited {waited:.1f} s for the agent to admit calls", flush=True)


# the SIP bridge's receive counters summed over a level's calls (`CallRecord.media["rx"]`):
# packets that came after their frame was played, lost, and frames the adaptive buffer grew by
RX_COUNTERS = {"rx_late": "late", "rx_lost": "lost", "rx_grown": "grown"}


async def sip_round_judged(
    agent: Any, rnd: list[dict[str, Any]], rx: dict[str, int]
) -> tuple[list[dict[str, Any]], int]:
    """One round of phone calls from sipp (bench/capacity_sip.py), judged from what went out on the wire;
    the bridge's receive counters are added to ``rx``."""
    from capacity_sip import RATE, sip_round

    with tempfile.TemporaryDirectory() as tmp:
        heard, records = await sip_round(agent, rnd, Path(tmp))
    judged = []
    for c in rnd:
        judged += judge(heard[c["id"]], RATE, c["truth"]["turns"], c.get("caller_db"))
    violations = sum((r.report or {}).get("summary", {}).get("violations", 0) for r in records)
    for key, field in RX_COUNTERS.items():
        rx[key] = rx.get(key, 0) + sum(int(r.media.get("rx", {}).get(field, 0)) for r in records)
    return judged, violations


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipelines.agent import Agent
    from pipelines.config import AgentConfig, load_config
    from pipelines.replay_concurrent import current_rss_mb

    legs = ["replay"]
    if args.sip:
        from capacity_sip import check_available

        check_available()
        legs.append("sip")
    cfg = load_config(args.config) if args.config else AgentConfig()
    cfg.cache.enabled = False  # the set's clips recur across calls: measure fresh replies
    cfg.agent.max_calls = max(cfg.agent.max_calls, *args.levels)
    calls = load_calls(args.split)
    caller_db = caller_levels(args.split)
    calls = [c | {"caller_db": caller_db[c["id"]]} for c in calls]
    t_load = time.monotonic()
    agent = await Agent.load(cfg)
    print(f"engines loaded in {time.monotonic() - t_load:.1f} s; {len(calls)} calls in {args.split}", flush=True)
    curves: dict[str, list[dict[str, Any]]] = {leg: [] for leg in legs}
    try:
        for leg in legs:
            for n in args.levels:
                judged: list[dict[str, Any]] = []
                cpu_s = wall_s = 0.0
                violations = 0
                rx: dict[str, int] = {}
                offset = 0 if args.same_calls else n
                for i, rnd in enumerate(rounds_for(calls, n, args.calls_per_level, offset=offset)):
                    cpu0, t0 = time.process_time(), time.monotonic()
                    if leg == "replay":
                        j, v = await replay_round(agent, rnd, args.keep / f"n{n}" if args.keep is not None else None)
                    else:
                        await until_admitting(agent)
                        j, v = await sip_round_judged(agent, rnd, rx)
                    cpu_s += time.process_time() - cpu0
                    wall_s += time.monotonic() - t0
                    judged += j
                    violations += v
                    print(f"{leg} N={n} round {i + 1}: {[c['id'] for c in rnd]} cuts {cut_kinds(j)}", flush=True)
                j = summary(judged)
                row = {"calls": n, "p50_ms": j["p50_ms"], "p95_ms": j["p95_ms"], "cutoffs": j["cutoffs"],
                       "missed": j["missed"], "turns": len(judged), "joins_talked_over": j["joins_talked_over"],
                       "overlap_max_ms": j["overlap_max_ms"],
                       "violations": violations, "cpu": round(cpu_s / wall_s, 3),
                       "rss_mb": round(current_rss_mb(), 1), **rx}
                curves[leg].append(row)
                print(leg, json.dumps(row), flush=True)
    finally:
        await agent.aclose()
    out: dict[str, Any] = {"split": args.split, "calls_per_level": args.calls_per_level, "p95_bound_ms": args.p95_ms,
                           "same_calls": args.same_calls,
                           "cores": os.cpu_count(), "curve": curves["replay"],
                           "capacity": largest_holding(curves["replay"], args.p95_ms)}
    if "sip" in curves:
        # the same rounds as phone calls: sipp dialling the SIP bridge (PCMU), judged on the wire
        out["sip"] = {"curve": curves["sip"], "capacity": largest_holding(curves["sip"], args.p95_ms)}
    return out


def plot(out: dict[str, Any], path: Path, p95_bound_ms: float) -> None:
    """The curve: p50 and p95 gap against simultaneous calls, the p95 bound, and the cut-offs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = out["curve"]
    n = [c["calls"] for c in curve]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(n, [c["p50_ms"] for c in curve], "o-", color="C0", label="p50 gap (replay)")
    ax.plot(n, [c["p95_ms"] for c in curve], "s-", color="C1", label="p95 gap (replay)")
    if "sip" in out:
        sip = out["sip"]["curve"]
        ax.plot([c["calls"] for c in sip], [c["p50_ms"] for c in sip], "o--", color="C0", alpha=0.6,
                label="p50 gap (SIP, sipp)")
        ax.plot([c["calls"] for c in sip], [c["p95_ms"] for c in sip], "s--", color="C1", alpha=0.6,
                label="p95 gap (SIP, sipp)")
    ax.axhline(p95_bound_ms, color="grey", linestyle="--", linewidth=1, label=f"p95 bound {p95_bound_ms:.0f} ms")
    for c in curve:
        ax.annotate(f"{c['cutoffs']:g} cut", (c["calls"], c["p95_ms"]), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)
    ax.set_xticks(n)
    ax.set_xlabel("simultaneous calls")
    ax.set_ylabel("gap from the true end (ms)")
    tops = [c["p95_ms"] for c in curve + (out["sip"]["curve"] if "sip" in out else [])]
    ax.set_ylim(0, max(p95_bound_ms, *tops) * 1.15)
    runs = f", medians of {out['runs']} runs" if out.get("runs", 1) > 1 else ""
    ax.set_title(f"capacity {out['capacity']} ({out['cores']} cores, {out['split']} split{runs})", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def from_medians(med: dict[str, Any]) -> dict[str, Any]:
    """bench/median_runs.py's medians of capacity runs, in the shape `plot` draws: each level's
    median figures, and the largest capacity any run found."""
    def leg(block: dict[str, Any]) -> dict[str, Any]:
        return {"curve": [{k: v["median"] for k, v in row.items()} for row in block["curve"]],
                "capacity": max(block["capacity"]["runs"])}

    out = {"split": med["split"], "cores": med.get("cores") or "?", "runs": med["runs"], **leg(med)}
    if "sip" in med:
        out["sip"] = leg(med["sip"])
    return out


def main() -> None:
    from pipelines.allocator import tune_allocator

    tune_allocator()  # as the voice-agent CLI does, before the engines' threads exist
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4], help="simultaneous calls to try")
    ap.add_argument("--calls-per-level", type=int, default=8, help="calls heard at each level (rounds of N)")
    ap.add_argument("--split", default="test", choices=("dev", "test"))
    ap.add_argument("--p95-ms", type=float, default=350.0, help="the p95 gap a level must hold")
    ap.add_argument("--config")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path, help="draw the curve to this file (SVG or PNG)")
    ap.add_argument("--same-calls", action="store_true",
                    help="every level hears the same calls (the first --calls-per-level of the split), so "
                         "the levels differ only in how many run at once; by default each level starts "
                         "further into the split")
    ap.add_argument("--keep", type=Path,
                    help="leave the replay leg's OUT.wav files and reports in this folder (KEEP/n<N>/)")
    ap.add_argument("--sip", action="store_true",
                    help="also dial every round through the SIP bridge with sipp (PCMU; needs root and sipp)")
    ap.add_argument("--plot-medians", type=Path,
                    help="run nothing: draw --plot from this bench/median_runs.py JSON of several capacity runs")
    args = ap.parse_args()
    if args.plot_medians:
        if not args.plot:
            ap.error("--plot-medians needs --plot")
        plot(from_medians(json.loads(args.plot_medians.read_text())), args.plot, args.p95_ms)
        return
    out = {"machine": machine.cpu(), **asyncio.run(run(args))}
    if args.plot:
        plot(out, args.plot, args.p95_ms)
    print(json.dumps(out, indent=2))
    print(f"capacity: {out['capacity']} simultaneous calls hold p95 <= {args.p95_ms:.0f} ms with no cut-offs")
    if "sip" in out:
        print(f"capacity over SIP (sipp, PCMU): {out['sip']['capacity']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""Reply-cache benchmark: calls in which some turns repeat, replayed with and without the cache.

    python bench/reply_cache.py [--json PATH] [--config F] [--skip-baseline] [--llm-block-ms MS]

Four calls of three caller turns each are built from real recorded speech (LibriVox clips
and a card clip from the pocketsphinx sdist, `tests/speech.py`); five of the twelve turns
repeat a turn of an earlier call, and two carry a number or a name (never cached). Each
call is replayed at real-time pace through one agent (default config, memory backend),
first with the cache off (the baseline), then with a fresh cache on.

Per turn: what the cache did (`turns[].cache.state`), the gap from the caller's true end of
speech (the source clip, `tests/ground_truth.py`) to the first audible agent sound in the
output track, and the gap from the VAD's last voiced frame to the first sample out
(`vad_gap_ms`) beside the floor the transport allows: the endpoint decision plus the output
buffer. CPU: the process's CPU seconds per call (every thread), and the CPU seconds the LM
and the TTS themselves spent (thread CPU time inside their calls). Memory: the bytes an
entry holds in the memory backend (int16 audio + text) and as FLAC (what Redis stores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tests import speech  # noqa: E402
from tests.ground_truth import audible_onsets, gaps_from_truth, speech_end  # noqa: E402
from voice.audio import read_wav  # noqa: E402

RATE = 16000
GAP_S = 2.5


def build_calls() -> list[dict[str, Any]]:
    lv, cards = speech.librivox(), speech.cards()
    plan = [  # lv[0] has a name (Mr. John Dashwood), cards[0] a number: never cached
        [lv[1], lv[2], cards[0]],
        [lv[4], lv[1], lv[3]],
        [lv[2], cards[0], lv[4]],
        [lv[1], lv[3], lv[0]],
    ]
    seen: set[str] = set()
    calls = []
    for clips in plan:
        parts, utts, t = [np.zeros(RATE, np.int16)], [], 1.0
        for clip in clips:
            pcm = read_wav(clip.path, RATE)[0]
            parts += [pcm, np.zeros(int(GAP_S * RATE), np.int16)]
            utts.append({"start": t, "end": t + len(pcm) / RATE, "true_end": t + speech_end(pcm, RATE),
                         "text": clip.text, "repeat": clip.text in seen})
            seen.add(clip.text)
            t += len(pcm) / RATE + GAP_S
        calls.append({"pcm": np.concatenate(parts), "utterances": utts})
    return calls


class EngineCpu:
    """Thread CPU seconds spent inside the LM's and the TTS's blocking calls (they run in
    worker threads, so each call's own thread time is its cost)."""

    def __init__(self, engines: Any) -> None:
        self.lm_s = 0.0
        self.tts_s = 0.0
        self.lm_calls = 0
        self.tts_calls = 0
        generate, synth = engines.responder.generate, engines.tts.synth

        def timed_generate(*a: Any, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return generate(*a, **kw)
            finally:
                self.lm_s += time.thread_time() - t0
                self.lm_calls += 1

        def timed_synth(*a: Any, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return synth(*a, **kw)
            finally:
                self.tts_s += time.thread_time() - t0
                self.tts_calls += 1

        engines.responder.generate = timed_generate
        engines.tts.synth = timed_synth

    def take(self) -> dict[str, float]:
        out = {"lm_cpu_s": round(self.lm_s, 3), "tts_cpu_s": round(self.tts_s, 3),
               "lm_calls": self.lm_calls, "tts_calls": self.tts_calls}
        self.lm_s = self.tts_s = 0.0
        self.lm_calls = self.tts_calls = 0
        return out


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


async def replay_all(agent: Any, calls: list[dict[str, Any]], cpu: EngineCpu, label: str) -> dict[str, Any]:
    from pipelines.replay import replay_pcm

    buffer_ms = agent.cfg.output.buffer_ms
    out: dict[str, Any] = {"calls": [], "turns": []}
    for i, call in enumerate(calls):
        cpu.take()
        c0 = time.process_time()
        report, track = await replay_pcm(agent, call["pcm"], RATE, fast=False)
        proc_s = time.process_time() - c0
        engine = cpu.take()
        utts = call["utterances"]
        truth = gaps_from_truth([(u["start"], u["true_end"]) for u in utts], audible_onsets(track, RATE))
        for k, u in enumerate(utts):
            # the report's turn for this utterance: the last one that started inside it
            turn = next((t for t in reversed(report["turns"])
                         if u["start"] - 0.3 <= t["user_speech_start_s"] <= u["end"]), None)
            stages = (turn or {}).get("stages", {})
            floor = stages.get("vad_endpoint", 0.0) + buffer_ms if turn else None
            out["turns"].append({
                "call": i, "utterance": k, "said": u["text"], "repeat": u["repeat"],
                "transcript": (turn or {}).get("transcript"), "response": (turn or {}).get("response"),
                "cache": (turn or {}).get("cache"), "truth_gap_ms": truth[k],
                "vad_gap_ms": (turn or {}).get("vad_gap_ms"), "floor_ms": floor, "stages": stages})
        out["calls"].append({"call": i, "process_cpu_s": round(proc_s, 3), **engine,
                             "cache_hits": report["summary"].get("cache_hits")})
        print(f"{label} call {i}: cpu {proc_s:.2f} s (LM {engine['lm_cpu_s']:.2f} s, TTS {engine['tts_cpu_s']:.2f} s)"
              f" gaps {truth} cache {[(t['cache'] or {}).get('state') for t in out['turns'] if t['call'] == i]}",
              flush=True)
    return out


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    turns = run["turns"]

    def gaps(pred: Any, key: str = "truth_gap_ms") -> list[float]:
        return [t[key] for t in turns if pred(t) and t[key] is not None and t[key] > 0]

    def state(t: dict[str, Any]) -> str | None:
        return (t["cache"] or {}).get("state")

    looked = [t for t in turns if state(t) in ("hit", "miss", "unavailable")]
    hits = [t for t in turns if state(t) == "hit"]
    over_floor = [t["vad_gap_ms"] - t["floor_ms"] for t in hits if t["vad_gap_ms"] is not None]
    calls = run["calls"]
    return {
        "turns": len(turns),
        "repeated_turns": sum(1 for t in turns if t["repeat"]),
        "cache_states": {s: sum(1 for t in turns if state(t) == s)
                         for s in ("hit", "miss", "unavailable", "uncacheable", "off")},
        "hit_rate": round(len(hits) / len(looked), 3) if looked else None,
        "hit_rate_on_repeats": round(len(hits) / max(1, sum(1 for t in turns if t["repeat"])), 3),
        "not_stored": [(t["cache"] or {}).get("not_stored") for t in turns if (t["cache"] or {}).get("not_stored")],
        "truth_gap_hits_p50_ms": pct(gaps(lambda t: state(t) == "hit"), 50),
        "truth_gap_hits_p95_ms": pct(gaps(lambda t: state(t) == "hit"), 95),
        "truth_gap_misses_p50_ms": pct(gaps(lambda t: state(t) != "hit"), 50),
        "truth_gap_misses_p95_ms": pct(gaps(lambda t: state(t) != "hit"), 95),
        "vad_gap_hits_p50_ms": pct(gaps(lambda t: state(t) == "hit", "vad_gap_ms"), 50),
        "vad_gap_misses_p50_ms": pct(gaps(lambda t: state(t) != "hit", "vad_gap_ms"), 50),
        # a hit's gap beyond the floor (endpoint decision + output buffer): ASR final + lookup
        "hit_over_floor_p50_ms": pct(over_floor, 50),
        "hit_over_floor_max_ms": round(max(over_floor), 1) if over_floor else None,
        # misses that speculation had ready by the commit also play at the floor
        "miss_over_floor_p50_ms": pct([t["vad_gap_ms"] - t["floor_ms"] for t in turns if state(t) != "hit"
                                       and t["vad_gap_ms"] is not None and t["floor_ms"] is not None], 50),
        "hit_llm_block_p50_ms": pct([t["stages"].get("llm_block", 0.0) for t in hits], 50),
        "hit_tts_first_audio_p50_ms": pct([t["stages"].get("tts_first_audio", 0.0) for t in hits], 50),
        "process_cpu_s_per_call": round(statistics.mean(c["process_cpu_s"] for c in calls), 3),
        "lm_tts_cpu_s_per_call": round(statistics.mean(c["lm_cpu_s"] + c["tts_cpu_s"] for c in calls), 3),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipelines.agent import Agent, load_engines
    from pipelines.config import AgentConfig, load_config
    from pipelines.reply_cache.entry import encode

    cfg = load_config(args.config) if args.config else AgentConfig()
    if args.llm_block_ms is not None:  # a reply cut by its deadline is never cached: try a wider one
        b = cfg.budgets.model_dump() | {"llm_block_ms": args.llm_block_ms}
        b["target_gap_ms"] = max(b["target_gap_ms"], sum(v for k, v in b.items() if k.endswith("_ms")
                                                         and k != "target_gap_ms"))
        cfg = cfg.model_copy(update={"budgets": type(cfg.budgets).model_validate(b)})
    engines = await asyncio.to_thread(load_engines, cfg)
    cpu = EngineCpu(engines)
    calls = build_calls()
    out: dict[str, Any] = {"config": {"backend": cfg.cache.backend, "llm_block_ms": cfg.budgets.llm_block_ms}}
    if not args.skip_baseline:
        off = Agent(cfg.model_copy(update={"cache": cfg.cache.model_copy(update={"enabled": False})}), engines)
        base = await replay_all(off, calls, cpu, "no cache")
        out["baseline"] = {**summarize(base), "turns_detail": base["turns"], "calls": base["calls"]}
    cached = Agent(cfg.model_copy(update={"cache": cfg.cache.model_copy(update={"enabled": True})}), engines)
    on = await replay_all(cached, calls, cpu, "cache")
    out["cache"] = {**summarize(on), "turns_detail": on["turns"], "calls": on["calls"]}
    store = cached.reply_cache.backend_store if cached.reply_cache is not None else None
    entries = list(getattr(store, "_entries", {}).values())
    if entries:
        flac = [len(encode(e)) for e, _ in entries]
        out["memory_per_entry"] = {
            "entries": len(entries),
            "bytes_p50": int(statistics.median(e.nbytes for e, _ in entries)),
            "flac_bytes_p50": int(statistics.median(flac)),
            "audio_s_p50": round(statistics.median(e.duration_s for e, _ in entries), 2),
        }
    if "baseline" in out:
        b, c = out["baseline"], out["cache"]
        out["cpu_saved_s_per_call"] = {
            "process": round(b["process_cpu_s_per_call"] - c["process_cpu_s_per_call"], 3),
            "lm_and_tts": round(b["lm_tts_cpu_s_per_call"] - c["lm_tts_cpu_s_per_call"], 3),
        }
    await cached.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--skip-baseline", action="store_true", help="only the replay with the cache on")
    ap.add_argument("--llm-block-ms", type=int, help="the committed LM deadline (default: the config's)")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    brief = {k: ({kk: vv for kk, vv in v.items() if kk not in ("turns_detail", "calls")} if isinstance(v, dict) else v)
             for k, v in out.items()}
    print(json.dumps(brief, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

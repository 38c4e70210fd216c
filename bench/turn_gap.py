"""Turn-gap benchmark on the evaluation set: our pipeline against LiveKit Agents, same engines,
same calls, same run, measured by a ruler neither holds.

    python bench/turn_gap.py [--split test] [--calls N] [--snr DB] [--json PATH] [--skip-livekit] [--skip-pipecat]

The calls are the evaluation set's (`bench/eval_calls.py`, docs/eval_set.md): real recorded
speech from several speakers, half of the calls through the 8 kHz band with G.711, with
mid-sentence pauses after function and content words, joins of two sentences, bare short
answers and background noise. Tune on ``--split dev``; the README reports ``test``. Each call
is replayed at real-time pace through:

- ours: `CallSession` via the replay transport, at the call's own rate, default config;
- LiveKit: a livekit-agents `AgentSession` with default turn handling, running the same
  faster-whisper, diffusion LM and Piper engines wrapped as livekit-agents plugins, with
  custom audio input/output and no room (16 kHz);
- Pipecat: a Pipecat 1.14 pipeline with its default turn strategy (Silero VAD, then Smart Turn
  v3.2), the same engines as Pipecat services, custom input and output transports
  (`pipelines.pipecat_peer`, docs/pipecat.md; 16 kHz).

Both are measured the same way, from the ground truth of the call (the caller's last audible
sample of each turn, taken from the source clip before noise and codec) to the first audible
sample of the agent's output track (an energy onset, `tests.ground_truth.audible_onsets`):

- gap: from a turn's true end to the first agent onset after it, before the next turn;
- cut-off: an agent onset inside a turn, in a mid-sentence pause (inserted after a function or a
  content word, or the speaker's own silence of 250 ms or more) or during speech; an onset in a
  join between two sentences is counted apart (``joins_talked_over``);
- overlap: for each onset inside a turn, how long the agent's sound went on while the caller
  spoke (from when the clean source is audible again after the pause it began in, to the end
  of the agent's sound or of the turn; ``overlap_max_ms``, ``overlaps_over_150_ms``);
- missed: a turn with no agent onset from its end to the next turn.

The old VAD-based figure (from webrtcvad's last voiced frame before each onset) stays as
``vad_p50_ms``, and our session's own estimate of the gap as ``session_gap_p50_ms``.
``replies_grammatical`` is the share of our replies, as the call's deadlines left them, that
link-grammar parses whole (the reply-quality judge, `llm.grammar_judge`), and
``replies_cut_short`` how many of them a deadline cut short of the reply the LM writes with
none (and how many of those stop inside a sentence).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import machine  # noqa: E402
from eval_calls import clean_calls, load_calls  # noqa: E402

from tests.ground_truth import audible_onsets, audible_until, levels_dbfs, loud_from  # noqa: E402
from tests.wer import wer, words  # noqa: E402
from voice.audio import read_wav, resample  # noqa: E402

RATE = 16000


def caller_levels(split: str) -> dict[str, np.ndarray]:
    """The ruler's copy of each caller of ``split``: its clean track's 10 ms frame levels
    (`levels_dbfs`; the levels, not the tracks, so a bench that measures RSS does not hold them)."""
    return {c["id"]: levels_dbfs(c["clean"], RATE) for c in clean_calls(split)}


def judge(track: np.ndarray, rate: int, turns: list[dict[str, Any]],
          caller_db: np.ndarray | None = None) -> list[dict[str, Any]]:
    """Per turn of the truth: its gap (ms, or None), where agent onsets fell inside it, and for
    each of those, how long the agent went on talking once the caller was speaking again
    (``caller_db``: the frame levels of the call's clean caller track, `levels_dbfs`, which
    say when that was)."""
    onsets = audible_onsets(track, rate)
    out = []
    for i, turn in enumerate(turns):
        nxt = turns[i + 1]["start_s"] if i + 1 < len(turns) else float("inf")
        inside = [o for o in onsets if turn["start_s"] + 0.05 < o < turn["end_s"]]
        cut = {"function": 0, "content": 0, "natural": 0, "join": 0, "speech": 0}
        onsets_inside = []
        for o in inside:
            kind = onset_kind(o, turn)
            cut[kind] += 1
            onsets_inside.append({"turn": i, "onset_s": round(o, 2), "kind": kind,
                                  "overlap_ms": overlap_ms(track, rate, o, turn, caller_db)})
        after = [o for o in onsets if turn["end_s"] <= o < nxt]
        out.append({"gap_ms": round((after[0] - turn["end_s"]) * 1000, 1) if after else None,
                    "cut": cut, "onsets_inside": onsets_inside, "replied": bool(after or inside), "kind": turn["kind"]})
    return out


def overlap_ms(track: np.ndarray, rate: int, onset: float, turn: dict[str, Any],
               caller_db: np.ndarray | None = None) -> float:
    """How long agent sound that began inside a caller's turn went on while the caller spoke:
    from the caller speaking again (the first frame of the clean caller track at the turn's
    energy gate, at or after the end of the pause the sound began in, or the onset itself
    during speech; an inserted pause may run on into the speaker's own silence) to the end of
    the agent's sound or of the caller's turn, whichever came first. 0 when the agent's sound
    ended before the caller went on."""
    pause_ends = [p["end_s"] for p in turn["pauses"] if p["start_s"] <= onset <= p["end_s"]]
    resumed = pause_ends[0] if pause_ends else onset
    if caller_db is not None:
        resumed = loud_from(caller_db, resumed, turn["gate_dbfs"]) or resumed
    stopped = min(audible_until(track, rate, onset), turn["end_s"])
    return round(max(0.0, stopped - resumed) * 1000, 1)


def onset_kind(onset: float, turn: dict[str, Any]) -> str:
    """Where an agent onset inside a caller's turn fell: the kind of the pause it is in
    (function, content, natural, join), or "speech"."""
    kinds = [p["kind"] for p in turn["pauses"] if p["start_s"] <= onset <= p["end_s"]]
    return kinds[0] if kinds else "speech"


def true_end_stages(report_turns: list[dict[str, Any]], truth_turns: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Where the time went, from each turn's true end to its reply's first audible sound: the
    VAD's last voiced frame after the true end, the endpoint decision after it (the VAD's pause
    report, the hypothesis, the opinions and the wait), the reply's first sample after the
    commit (LM and TTS when not ready, and the output buffer), and its first audible sound
    after that. The reply to a truth turn is our last turn committed inside it."""
    out = []
    for i, tt in enumerate(truth_turns):
        nxt = truth_turns[i + 1]["start_s"] if i + 1 < len(truth_turns) else float("inf")
        mine = [r for r in report_turns if tt["start_s"] <= r["user_speech_end_s"] < nxt and r["endpoint"].get("t")
                and r.get("agent_audible_s") is not None and r["agent_audible_s"] >= tt["end_s"]]
        if not mine:
            continue
        r = mine[-1]
        out.append({
            "vad_end": (r["user_speech_end_s"] - tt["end_s"]) * 1000,
            "endpoint": (r["endpoint"]["t"] - r["user_speech_end_s"]) * 1000,
            "commit_to_audio": (r["agent_audio_start_s"] - r["endpoint"]["t"]) * 1000,
            "audible_lead": (r["agent_audible_s"] - r["agent_audio_start_s"]) * 1000,
            "final_text_after_vad_end": r["speculation"].get("final_text_ms"),
        })
    return out


def stage_medians(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    keys = ("vad_end", "endpoint", "commit_to_audio", "audible_lead", "final_text_after_vad_end")
    return {k: pct([r[k] for r in rows if r.get(k) is not None], 50) for k in keys}


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


def grammatical_share(replies: list[str | None]) -> float | None:
    """The share of the replies link-grammar parses whole (`llm.grammar_judge`); None without it."""
    from llm.grammar_judge import JudgeUnavailable, LinkGrammarJudge

    said = [r for r in replies if r]
    try:
        judge = LinkGrammarJudge()
    except JudgeUnavailable:
        return None
    return round(sum(judge.grammatical(r) for r in said) / len(said), 3) if said else None


def cut_short(responder: Any, turns: list[dict[str, Any]]) -> dict[str, int] | None:
    """How many replies the call's deadlines cut short: the reply said is the start of the one
    the embedded LM writes with no deadline (the same seed), and of those, how many stop inside
    a sentence. Run after the calls, so that it takes no time from them."""
    if not hasattr(responder, "generate"):
        return None  # a remote LM: nothing to compare with
    said = [t for t in turns if t["response"]]
    shortened = mid = 0
    for t in said:
        whole = responder.generate(t["transcript"]).text
        if t["response"] != whole and whole.startswith(t["response"]):
            shortened += 1
            mid += not t["response"].rstrip().endswith((".", "!", "?"))
    return {"replies": len(said), "shortened": shortened, "mid_sentence": mid}


def cut_kinds(judged: list[dict[str, Any]]) -> list[str]:
    """The kind of each agent onset inside a turn, in turn order (for a call's or round's line)."""
    return [k for j in judged for k, n in j["cut"].items() if n]


def summary(judged: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = [j["gap_ms"] for j in judged if j["gap_ms"] is not None]
    cut = {k: sum(j["cut"][k] for j in judged) for k in ("function", "content", "natural", "join", "speech")}
    cutoffs = cut["function"] + cut["content"] + cut["natural"] + cut["speech"]
    overlaps = [o["overlap_ms"] for j in judged for o in j["onsets_inside"]]
    return {
        "p50_ms": pct(gaps, 50), "p95_ms": pct(gaps, 95),
        # mid-sentence pauses and speech: the cut-offs the targets allow none of
        "cutoffs": cutoffs,
        "cutoffs_after_function_word": cut["function"], "cutoffs_after_content_word": cut["content"],
        "cutoffs_in_natural_pauses": cut["natural"], "cutoffs_during_speech": cut["speech"],
        "joins_talked_over": cut["join"],
        # each overlap's length once the caller spoke again (the target: each stopped within 150 ms)
        "overlap_p50_ms": pct(overlaps, 50), "overlap_max_ms": max(overlaps) if overlaps else None,
        "overlaps_over_150_ms": sum(1 for x in overlaps if x > 150),
        "missed": sum(1 for j in judged if j["gap_ms"] is None and not sum(j["cut"].values())),
        "false_cutoff_rate": round(cutoffs / max(1, len(judged)), 3),
        "gap_p50_by_kind_ms": {k: pct([j["gap_ms"] for j in judged if j["kind"] == k and j["gap_ms"] is not None], 50)
                               for k in sorted({j["kind"] for j in judged})},
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipelines.agent import Agent
    from pipelines.config import AgentConfig, load_config
    from pipelines.peer_replay import gaps, voiced_frame_ends
    from pipelines.replay import replay_pcm

    cfg = load_config(args.config) if args.config else AgentConfig()
    # the bench's clips recur across calls: it measures fresh replies (bench/reply_cache.py the cache)
    cfg.cache.enabled = False
    agent = await Agent.load(cfg)
    calls = load_calls(args.split, snr=args.snr)[: args.calls or None]
    caller_db = caller_levels(args.split)
    ours_j: list[dict[str, Any]] = []
    lk_j: list[dict[str, Any]] = []
    pc_j: list[dict[str, Any]] = []
    pc_turns: list[dict[str, Any]] = []
    if not args.skip_pipecat:
        from loguru import logger  # Pipecat logs every frame at DEBUG

        logger.remove()
        logger.add(sys.stderr, level="WARNING")
    ours: dict[str, Any] = {"vad_gaps": [], "session_gaps": [], "stages": {}, "turns": [], "hits": 0, "spec": 0,
                            "violations": 0, "wasted_ms": 0.0, "recovered": 0, "fallbacks": 0,
                            "wer_errors": 0.0, "wer_words": 0, "true_stages": {8000: [], 16000: []},
                            "onsets_inside": []}
    lk_turns: list[dict[str, Any]] = []
    for call in calls:
        truth = call["truth"]
        pcm, rate = read_wav(call["wav"])
        report, track = await replay_pcm(agent, pcm, rate, fast=False)
        judged = judge(track, rate, truth["turns"], caller_db[call["id"]])
        ours_j += judged
        ours["onsets_inside"] += [{"call": call["id"]} | o for j in judged for o in j["onsets_inside"]]
        pcm16 = pcm if rate == RATE else resample(pcm, rate, RATE)
        onsets = [t["agent_audio_start_s"] for t in report["turns"] if t["agent_audio_start_s"] is not None]
        ours["vad_gaps"] += [round((on - end) * 1000, 1) for end, on in gaps(onsets, voiced_frame_ends(pcm16))]
        ours["session_gaps"] += [t["gap_ms"] for t in report["turns"] if t["gap_ms"] is not None]
        ours["true_stages"].setdefault(rate, []).extend(true_end_stages(report["turns"], truth["turns"]))
        ours["fallbacks"] += report["summary"].get("fallbacks", 0)
        ours["violations"] += report["summary"]["violations"]
        ours["wasted_ms"] += report["summary"].get("speculation_wasted_ms", 0.0)
        ours["recovered"] += report["summary"].get("cutoffs_recovered", 0)
        # the final transcripts against what was said, as one text (robust to a turn split or
        # merged); turns without a reference transcript are left out
        if all(t["text"] for t in truth["turns"]):
            ref = " ".join(t["text"] for t in truth["turns"])
            ours["wer_errors"] += wer(ref, " ".join(t["transcript"] for t in report["turns"])) * len(words(ref))
            ours["wer_words"] += len(words(ref))
        for t in report["turns"]:
            ours["turns"].append({
                "call": call["id"], "transcript": t["transcript"], "response": t["response"],
                "session_gap_ms": t["gap_ms"],
                "endpoint": {k: t["endpoint"].get(k) for k in ("reason", "silence_ms", "required_ms",
                                                               "lm_turn_end_prob", "smart_turn_prob")},
                "final_text_ms": t["speculation"].get("final_text_ms"),
                "ready_ms": t["speculation"].get("ready_ms"), "stages": t["stages"]})
            ours["spec"] += int(t["speculation"]["used"])
            ours["hits"] += int(t["speculation"]["hit"])
            for k, v in t["stages"].items():
                ours["stages"].setdefault(k, []).append(v)
        print(f"{call['id']} ({rate} Hz): ours {[j['gap_ms'] for j in judged]} "
              f"cuts {cut_kinds(judged)}", flush=True)
        if not args.skip_livekit:
            from pipelines.livekit_plugins.session_replay import run_livekit_session

            res = await run_livekit_session(agent, pcm16, cfg=cfg, keep_audio=True)
            judged_lk = judge(res["agent_audio"], RATE, truth["turns"], caller_db[call["id"]])
            lk_j += judged_lk
            lk_turns += [{"call": call["id"]} | t for t in res["turns"]]
            print(f"{call['id']}: livekit {[j['gap_ms'] for j in judged_lk]} "
                  f"cuts {cut_kinds(judged_lk)}", flush=True)
        if not args.skip_pipecat:
            from pipelines.pipecat_peer import run_pipecat_session

            res = await run_pipecat_session(agent, pcm16, cfg=cfg)
            judged_pc = judge(res["agent_audio"], RATE, truth["turns"], caller_db[call["id"]])
            pc_j += judged_pc
            pc_turns += [{"call": call["id"]} | t for t in res["turns"]]
            print(f"{call['id']}: pipecat {[j['gap_ms'] for j in judged_pc]} "
                  f"cuts {cut_kinds(judged_pc)}", flush=True)
    paused = sum(1 for c in calls for t in c["truth"]["turns"] if t["pauses"])
    out: dict[str, Any] = {
        "split": args.split, "snr_db": args.snr, "calls": len(calls), "turns": len(ours_j),
        "turns_with_mid_pause": paused,
        "ours": {**summary(ours_j),
                 # the old figure, from webrtcvad's last voiced frame before each onset
                 "vad_p50_ms": pct(ours["vad_gaps"], 50), "vad_p95_ms": pct(ours["vad_gaps"], 95),
                 "session_gap_p50_ms": pct(ours["session_gaps"], 50),
                 "fallbacks": ours["fallbacks"],
                 "speculation_hit_rate": round(ours["hits"] / ours["spec"], 3) if ours["spec"] else None,
                 "violations": ours["violations"],
                 "stage_p50_ms": {k: round(statistics.median(v), 1) for k, v in ours["stages"].items()},
                 # from the true end: medians per stage, by the call's sample rate
                 "true_end_stage_p50_ms": {f"{r // 1000} kHz": stage_medians(v)
                                           for r, v in ours["true_stages"].items() if v},
                 "premature_endpoints_taken_back": ours["recovered"],
                 "speculation_wasted_s": round(ours["wasted_ms"] / 1000, 1),
                 "final_transcript_wer": round(ours["wer_errors"] / max(1, ours["wer_words"]), 3),
                 # the replies as the pipeline decided them (deadlines included), by link-grammar
                 "replies_grammatical": grammatical_share([t["response"] for t in ours["turns"]]),
                 "replies_cut_short": cut_short(agent.engines.responder, ours["turns"]),
                 "turns": ours["turns"],
                 # every agent onset inside a caller's turn: where, and how long it went on over them
                 "onsets_inside": ours["onsets_inside"]},
        "livekit": {**summary(lk_j), "turns": lk_turns} if not args.skip_livekit else None,
        "pipecat": {**summary(pc_j), "turns": pc_turns} if not args.skip_pipecat else None,
    }
    if out["livekit"] and out["livekit"]["p50_ms"] and out["ours"]["p50_ms"]:
        out["ratio_p50"] = round(out["ours"]["p50_ms"] / out["livekit"]["p50_ms"], 3)
    if out["pipecat"] and out["pipecat"]["p50_ms"] and out["ours"]["p50_ms"]:
        out["ratio_p50_pipecat"] = round(out["ours"]["p50_ms"] / out["pipecat"]["p50_ms"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="test", choices=("dev", "test"), help="tune on dev, report test")
    ap.add_argument("--calls", type=int, default=0, help="only the first N calls of the split (0: all)")
    ap.add_argument("--snr", type=float,
                    help="a stress variant: pink noise at this SNR (dB) on every call (default: the set as built)")
    ap.add_argument("--config")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--skip-livekit", action="store_true")
    ap.add_argument("--skip-pipecat", action="store_true")
    args = ap.parse_args()
    out = {"machine": machine.cpu(), **asyncio.run(run(args))}
    brief = {**out, "ours": {k: v for k, v in out["ours"].items() if k not in ("turns", "onsets_inside")}}
    for peer in ("livekit", "pipecat"):
        if out[peer]:
            brief[peer] = {k: v for k, v in out[peer].items() if k != "turns"}
    print(json.dumps(brief, indent=2))  # the per-turn detail goes to --json only
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""Turn-gap benchmark: our pipeline against LiveKit Agents, same engines, same calls, same run.

    python bench/turn_gap.py [--calls 2] [--json PATH] [--skip-livekit]

Calls are built from real recorded speech (LibriVox clips with word alignments from the
pocketsphinx sdist, and the pocketsphinx card clips). Some turns get a 400-700 ms pause
inserted right after a function word ("to", "in", "for", "the" ...), the hardest case for an
endpointer. Each call is replayed at real-time pace through:

- ours: `CallSession` via the replay transport, default config;
- LiveKit: a livekit-agents `AgentSession` with default turn handling, running the same
  faster-whisper, diffusion LM and Piper engines wrapped as livekit-agents plugins, with
  custom audio input/output and no room.

The gap is measured the same way for both: from the last frame webrtcvad calls voiced (frame
by frame, no hysteresis) before each agent onset to the first agent sample out, both through
the same playout buffer (``output.buffer_ms``, 20 ms; without it on LiveKit's side, its gaps
would read that much shorter). Our session's own figure, whose VAD segmenter ignores isolated
voiced blips, is `session_gap_p50_ms`. A cut-off is agent audio starting while the caller's
utterance (pauses included) is still in progress; a missed reply is an utterance with no agent
audio before the next one. LiveKit may also commit a turn at a mid-sentence pause and hold the
reply until the caller stops; such a reply starts right after the caller's last word but
answers only the words before the pause. It is counted as a fragment reply, and LiveKit's
p50/p95 are also given over its whole-turn replies only (`ratio_p50_whole_turns`); every reply
of ours answers the whole turn. Prints p50/p95, cut-offs (and the false cut-off rate: cut-offs
per turn), misses, speculation hit rate and wasted compute, per-stage medians, violations, the
WER of our final transcripts, and the ratio of our p50 to LiveKit's.
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
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tests import speech  # noqa: E402
from tests.ground_truth import audible_onsets, gaps_from_truth, speech_end  # noqa: E402
from tests.wer import wer, words  # noqa: E402
from voice.audio import read_wav  # noqa: E402

RATE = 16000
FUNCTION_WORDS = {"to", "in", "for", "the", "and", "a", "of", "be", "an", "than", "his", "he", "have"}
PAUSES_S = (0.4, 0.55, 0.7)


def _alignment(clip: speech.Clip) -> list[tuple[str, float, float]]:
    j = clip.path.with_suffix(".json")
    if not j.exists():
        return []
    words = json.loads(j.read_text())["w"]
    return [(w["t"].split("(")[0], w["b"], w["b"] + w["d"]) for w in words if not w["t"].startswith("<")]


def with_pause(clip: speech.Clip, pause_s: float) -> tuple[np.ndarray, bool]:
    """Insert ``pause_s`` of silence after a function word in the middle of the clip."""
    pcm, _ = read_wav(clip.path, RATE)
    words = _alignment(clip)
    mids = [w for w in words[2:-2] if w[0] in FUNCTION_WORDS]
    if not mids:
        return pcm, False
    _, _, end = mids[len(mids) // 2]
    cut = int(end * RATE)
    return np.concatenate([pcm[:cut], np.zeros(int(pause_s * RATE), np.int16), pcm[cut:]]), True


def build_calls(n: int, gap_s: float = 3.0) -> list[dict[str, Any]]:
    lv, cards = speech.librivox(), speech.cards()
    pool = [lv[0], cards[0], lv[3], lv[1], cards[4], lv[2], lv[4], cards[1]]
    calls = []
    for c in range(n):
        parts, utts, t = [np.zeros(RATE, np.int16)], [], 1.0
        for k in range(3):
            clip = pool[(3 * c + k) % len(pool)]
            pause = PAUSES_S[(c + k) % len(PAUSES_S)]
            pcm, paused = with_pause(clip, pause) if k != 1 else (read_wav(clip.path, RATE)[0], False)
            parts += [pcm, np.zeros(int(gap_s * RATE), np.int16)]
            end = t + len(pcm) / RATE
            utts.append({"start": t, "end": end, "true_end": t + speech_end(pcm, RATE), "text": clip.text,
                         "mid_pause_s": pause if paused else 0})
            t += len(pcm) / RATE + gap_s
        calls.append({"pcm": np.concatenate(parts), "utterances": utts})
    return calls


def score(onsets: list[float], utts: list[dict[str, Any]]) -> tuple[int, int]:
    """(cut-offs, missed replies) from agent audio onsets and the true utterance spans."""
    cutoffs = sum(1 for o in onsets for u in utts if u["start"] + 0.1 < o < u["end"] - 0.1)
    missed = 0
    for i, u in enumerate(utts):
        nxt = utts[i + 1]["start"] if i + 1 < len(utts) else float("inf")
        if not any(u["end"] - 0.1 <= o < nxt for o in onsets):
            missed += 1
    return cutoffs, missed


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipelines.agent import Agent
    from pipelines.config import AgentConfig, load_config
    from pipelines.livekit_plugins.session_replay import gaps, voiced_frame_ends
    from pipelines.replay import replay_pcm

    cfg = load_config(args.config) if args.config else AgentConfig()
    # the bench's clips recur across calls: it measures fresh replies (bench/reply_cache.py the cache)
    cfg.cache.enabled = False
    agent = await Agent.load(cfg)
    calls = build_calls(args.calls)
    ours: dict[str, Any] = {"gaps": [], "cutoffs": 0, "missed": 0, "hits": 0, "spec": 0, "violations": 0,
                            "stages": {}, "wasted_ms": 0.0, "recovered": 0, "turns": [],
                            "content_gaps": [], "fallbacks": 0,
                            "session_gaps": [], "wer_errors": 0.0, "wer_words": 0, "truth_gaps": []}
    lk: dict[str, Any] = {"gaps": [], "cutoffs": 0, "missed": 0, "whole_gaps": [], "fragments": 0, "turns": []}
    for i, call in enumerate(calls):
        report, track = await replay_pcm(agent, call["pcm"], RATE, fast=False)
        # from the caller's last audible sample (source clip) to the first audible agent sound
        truth = gaps_from_truth([(u["start"], u["true_end"]) for u in call["utterances"]],
                                audible_onsets(track, RATE))
        ours["truth_gaps"] += [g for g in truth if g is not None and g > 0]
        onsets = [t["agent_audio_start_s"] for t in report["turns"] if t["agent_audio_start_s"] is not None]
        c, m = score(onsets, call["utterances"])
        ours["cutoffs"] += c
        ours["missed"] += m
        # the gap as LiveKit's is measured: from the last webrtcvad-voiced frame before each
        # agent onset (the session's own gap_ms uses its VAD segmenter, which ignores blips)
        call_gaps = [round((on - end) * 1000, 1) for end, on in gaps(onsets, voiced_frame_ends(call["pcm"]))]
        ours["gaps"] += call_gaps
        ours["session_gaps"] += [t["gap_ms"] for t in report["turns"] if t["gap_ms"] is not None]
        ours["content_gaps"] += [(t["first_content_audio_s"] - t["user_speech_end_s"]) * 1000
                                 for t in report["turns"] if t["first_content_audio_s"] is not None]
        ours["fallbacks"] += report["summary"].get("fallbacks", 0)
        ours["violations"] += report["summary"]["violations"]
        ours["wasted_ms"] += report["summary"].get("speculation_wasted_ms", 0.0)
        ours["recovered"] += report["summary"].get("cutoffs_recovered", 0)
        # the final transcripts of the call against what was said, as one text (robust to a
        # turn split or merged)
        ref = " ".join(u["text"] for u in call["utterances"])
        ours["wer_errors"] += wer(ref, " ".join(t["transcript"] for t in report["turns"])) * len(words(ref))
        ours["wer_words"] += len(words(ref))
        for t in report["turns"]:
            ours["turns"].append({
                "call": i, "transcript": t["transcript"], "gap_ms": t["gap_ms"],
                "endpoint": {k: t["endpoint"].get(k) for k in ("reason", "silence_ms", "required_ms",
                                                               "lm_turn_end_prob")},
                "final_text_ms": t["speculation"].get("final_text_ms"),
                "ready_ms": t["speculation"].get("ready_ms"), "stages": t["stages"]})
            ours["spec"] += int(t["speculation"]["used"])
            ours["hits"] += int(t["speculation"]["hit"])
            for k, v in t["stages"].items():
                ours["stages"].setdefault(k, []).append(v)
        print(f"call {i}: ours gaps {call_gaps} cutoffs {c} missed {m}", flush=True)
        if not args.skip_livekit:
            from pipelines.livekit_plugins.session_replay import run_livekit_session

            res = await run_livekit_session(agent, call["pcm"], cfg=cfg)
            on = [t["agent_start_s"] for t in res["turns"]]
            c2, m2 = score(on, call["utterances"])
            lk["cutoffs"] += c2
            lk["missed"] += m2
            lk["gaps"] += res["gaps_ms"]
            lk["whole_gaps"] += [t["gap_ms"] for t in res["turns"] if t["whole_turn"]]
            lk["fragments"] += sum(1 for t in res["turns"] if not t["whole_turn"])
            lk["turns"] += [{"call": i} | t for t in res["turns"]]
            print(f"call {i}: livekit gaps {res['gaps_ms']} (whole turns: "
                  f"{[t['gap_ms'] for t in res['turns'] if t['whole_turn']]}) cutoffs {c2} missed {m2}", flush=True)
    turns = sum(len(c["utterances"]) for c in calls)
    paused = sum(1 for c in calls for u in c["utterances"] if u["mid_pause_s"])
    out = {
        "turns": turns,
        "turns_with_mid_pause": paused,
        "ours": {"p50_ms": pct(ours["gaps"], 50), "p95_ms": pct(ours["gaps"], 95), "cutoffs": ours["cutoffs"],
                 # the same replies, measured from the caller's true end of speech to the first
                 # audible agent sound (tests/ground_truth.py)
                 "truth_p50_ms": pct(ours["truth_gaps"], 50), "truth_p95_ms": pct(ours["truth_gaps"], 95),
                 "missed": ours["missed"],
                 "session_gap_p50_ms": pct(ours["session_gaps"], 50),
                 # with turn.fallback an acknowledgement may come first: the reply's own audio
                 "first_content_p50_ms": pct(ours["content_gaps"], 50),
                 "first_content_p95_ms": pct(ours["content_gaps"], 95),
                 "fallbacks": ours["fallbacks"],
                 "speculation_hit_rate": round(ours["hits"] / ours["spec"], 3) if ours["spec"] else None,
                 "violations": ours["violations"],
                 "stage_p50_ms": {k: round(statistics.median(v), 1) for k, v in ours["stages"].items()},
                 "false_cutoff_rate": round(ours["cutoffs"] / turns, 3),
                 "premature_endpoints_taken_back": ours["recovered"],
                 "speculation_wasted_s": round(ours["wasted_ms"] / 1000, 1),
                 "prepared_ready_p50_ms": pct([t["ready_ms"] for t in ours["turns"] if t["ready_ms"] is not None], 50),
                 "final_text_p50_ms": pct([t["final_text_ms"] for t in ours["turns"]
                                           if t["final_text_ms"] is not None], 50),
                 "final_transcript_wer": round(ours["wer_errors"] / max(1, ours["wer_words"]), 3),
                 "turns": ours["turns"]},
        "livekit": {"p50_ms": pct(lk["gaps"], 50), "p95_ms": pct(lk["gaps"], 95), "cutoffs": lk["cutoffs"],
                    "missed": lk["missed"], "false_cutoff_rate": round(lk["cutoffs"] / turns, 3),
                    # replies to a turn LiveKit committed at a mid-sentence pause (audio held until
                    # the caller stopped): they answer the words before the pause
                    "fragment_replies": lk["fragments"],
                    "whole_turn_p50_ms": pct(lk["whole_gaps"], 50), "whole_turn_p95_ms": pct(lk["whole_gaps"], 95),
                    "turns": lk["turns"]}
        if not args.skip_livekit else None,
    }
    if out["livekit"] and out["livekit"]["p50_ms"] and out["ours"]["p50_ms"]:
        out["ratio_p50"] = round(out["ours"]["p50_ms"] / out["livekit"]["p50_ms"], 3)
        # every reply of ours answers a whole turn (it is generated from, or checked against, the
        # final transcript of all the caller's audio), so ours against LiveKit's whole-turn replies
        if out["livekit"]["whole_turn_p50_ms"]:
            out["ratio_p50_whole_turns"] = round(out["ours"]["p50_ms"] / out["livekit"]["whole_turn_p50_ms"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=4, help="3 turns each; 4 calls use every clip of the pool")
    ap.add_argument("--config")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--skip-livekit", action="store_true")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    brief = {**out, "ours": {k: v for k, v in out["ours"].items() if k != "turns"}}
    if out["livekit"]:
        brief["livekit"] = {k: v for k, v in out["livekit"].items() if k != "turns"}
    print(json.dumps(brief, indent=2))  # the per-turn detail goes to --json only
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

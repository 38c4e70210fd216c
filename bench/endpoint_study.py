"""Which evidence should end a turn? Words, prosody, or both: cut-offs against latency.

    python bench/endpoint_study.py [--split dev] [--json PATH]
    python bench/endpoint_study.py --features bench/results/endpoint_study_dev.json \
        --turn-end-lm llm/weights/turn_end_lm --json PATH   # the words read by another LM

For every pause inside a caller turn (mid-sentence pauses after function and content words,
joins between two sentences) and every true turn end of the evaluation set
(`bench/eval_calls.py`), measured from the caller's true last audible sample ``e``:

- the words: Whisper's transcript of the turn up to ``e`` + 100 ms (the hypothesis the session
  has at its pause), the word it nearly wrote next, and the LM's turn-end probability, read by
  `pipelines.endpointing.completeness` (the words' surface and the LM);
- the prosody: Smart Turn v3.2 (`voice.smart_turn`) on the turn's audio up to ``e`` + 100 ms
  (what the session has when its VAD reports the pause), and again up to ``e`` + 300, 400 and
  500 ms, for a rule that asks it a second time as the pause goes on.

Each policy maps the evidence to a wait from ``e``; a pause of length ``d`` is talked over when
the wait is under ``d`` plus ``--notice-ms``: the session commits whenever its silence clock
reaches the wait before it has seen the caller speak again, and the reply is then audible
20 ms later, inside the pause or just after it (where the listener's ruler counts it all the
same). Its clock starts at the VAD's last voiced frame, 10-20 ms after ``e``, and it sees the
caller resume when a voiced frame ends, a median 22 ms after they do (dev split), so it sees a
pause about 10 ms longer than it was (the default). For each policy it prints the cut-offs on
mid-sentence pauses, the joins talked over, and the median, p95 and mean wait at true turn
ends; tune on dev, report test. Offline: no real-time
replay, so it measures the decision rule only, not the pipeline's compute delays.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval_calls import load_calls  # noqa: E402

from pipelines.endpointing import completeness, lm_can_move  # noqa: E402
from voice.audio import read_wav  # noqa: E402

RATE = 16000
LOOK_S = 0.1  # what the session has heard past the end when it decides: its VAD's pause report
LATE_LOOKS_MS = (300, 400, 500)  # Smart Turn asked again this far past the end
SMART_TURN_MS = 50  # what one Smart Turn answer takes in the session's worker


def points(call: dict[str, Any]) -> list[dict[str, Any]]:
    """The decision points of a call: each pause inside a turn, and each true turn end."""
    out = []
    for turn in call["truth"]["turns"]:
        for p in turn.get("pauses", []):
            out.append({"start": turn["start_s"], "e": p["start_s"], "d_ms": (p["end_s"] - p["start_s"]) * 1000,
                        "kind": p["kind"], "after": p.get("after_word")})
        out.append({"start": turn["start_s"], "e": turn["end_s"], "d_ms": None, "kind": "end",
                    "turn_kind": turn.get("kind")})
    return out


def features(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from pipelines.agent import load_engines
    from pipelines.config import AgentConfig
    from voice.smart_turn import SmartTurn

    cfg = AgentConfig()
    engines = load_engines(cfg)
    turn = SmartTurn()
    rows = []
    for call in calls:
        pcm, _ = read_wav(call["wav"], RATE)
        x = pcm.astype(np.float32) / 32768.0
        for pt in points(call):
            a = x[max(0, int((pt["start"] - 0.3) * RATE)): int((pt["e"] + LOOK_S) * RATE)]
            res = engines.asr.transcribe(a)
            text = res.text.strip()
            near = (res.near_next, res.near_share) if res.near_next else None
            lm = engines.responder.turn_end_prob(text) if text and lm_can_move(text) else None
            rows.append({**pt, "call": call["id"], "text": text, "near": near, "lm": lm,
                         "p_words": completeness(text, lm, near), "p_audio": turn.predict(a),
                         "p_audio_late": late_audio(turn, x, pt)})
            print(f"{call['id']} {pt['kind']:8s} words {rows[-1]['p_words']:.2f} audio {rows[-1]['p_audio']:.2f} "
                  f"| {text[-60:]}", flush=True)
    return rows


def late_audio(turn: Any, x: np.ndarray, pt: dict[str, Any]) -> dict[str, float]:
    """Smart Turn on the turn's audio up to ``e`` + each of `LATE_LOOKS_MS` (past a shorter
    pause it hears the caller going on; the policies only ask it where the pause lasts)."""
    start = max(0, int((pt["start"] - 0.3) * RATE))
    return {str(ms): turn.predict(x[start: int((pt["e"] + ms / 1000) * RATE)]) for ms in LATE_LOOKS_MS}


def add_late_audio(rows: list[dict[str, Any]], split: str) -> None:
    """Fills in `late_audio` for rows saved before it existed (no ASR needed)."""
    from voice.smart_turn import SmartTurn

    todo = [r for r in rows if "p_audio_late" not in r]
    if not todo:
        return
    turn, wavs = SmartTurn(), {c["id"]: c["wav"] for c in load_calls(split)}
    for cid in dict.fromkeys(r["call"] for r in todo):
        pcm, _ = read_wav(wavs[cid], RATE)
        x = pcm.astype(np.float32) / 32768.0
        for r in todo:
            if r["call"] == cid:
                r["p_audio_late"] = late_audio(turn, x, r)


def reread_words(rows: list[dict[str, Any]], model: Path, min_words: int = 1) -> list[dict[str, Any]]:
    """The rows with the LM's opinion of their words from the turn-end LM in ``model``
    (`llm.turn_end_lm`) instead of the probe, where the probe was asked; words fewer than
    ``min_words`` get no LM opinion."""
    from llm.turn_end import strip_trailing_punct
    from llm.turn_end_lm import TurnEndLM

    lm = TurnEndLM.load(model)
    out = []
    for r in rows:
        q = dict(r)
        if r["lm"] is not None:
            short = len(strip_trailing_punct(r["text"]).split()) < min_words
            q["lm"] = None if short else lm.prob(r["text"])
            q["p_words"] = completeness(r["text"], q["lm"], tuple(r["near"]) if r["near"] else None)
        out.append(q)
    return out


def _logit(p: float) -> float:
    p = min(max(p, 1e-4), 1 - 1e-4)
    return math.log(p / (1 - p))


def wait_ms(c: float, lo: float, hi: float, sure: float = 0.85) -> float:
    """The endpointer's schedule: ``lo`` when as sure as ``sure``, growing with the doubt^1.5."""
    doubt = min(1.0, max(0.0, (sure - c) / sure))
    return lo + (hi - lo) * doubt**1.5


def _session(r: dict[str, Any], doubt_ms: float) -> float:
    """The session's rule: 900 ms after a trailing function word, 360 ms when the words and
    the sound both say done, else ``doubt_ms`` (800 in the session)."""
    if r["p_words"] <= 0.1:
        return 900.0
    return 360.0 if r["p_words"] >= 0.5 and r["p_audio"] >= 0.5 else doubt_ms


def policies() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in (200, 300, 500, 700, 900):
        out[f"silence {s}"] = lambda r, s=s: float(s)
    for lo in (80, 150, 250):
        out[f"words lo={lo}"] = lambda r, lo=lo: wait_ms(r["p_words"], lo, 900)
    for th in (0.5, 0.7, 0.9):
        for s in (100, 200):
            # Pipecat's shape: after s ms of silence ask the model; unfinished waits the maximum
            out[f"audio >{th} at {s}"] = lambda r, th=th, s=s: float(s) if r["p_audio"] > th else 1200.0
    for w in (1.0, 2.0):
        # one probability from both: the sound's log-odds added to the words'
        def summed(r: dict[str, Any], w: float = w) -> float:
            if r["p_words"] <= 0.1:  # a trailing function word or comma: the sound cannot overrule it
                return wait_ms(r["p_words"], 80, 900)
            return wait_ms(1 / (1 + math.exp(-(_logit(r["p_words"]) + w * _logit(r["p_audio"])))), 80, 900)
        out[f"both summed w={w}"] = summed
    for th in (0.4, 0.5, 0.6, 0.7, 0.8):
        for lo, mid in ((80, 800), (270, 800), (330, 800), (360, 800), (400, 800), (360, 600)):
            # the session's rule (`pipelines.endpointing.AGREE`): the shortest wait (``lo``,
            # turn.agree_silence_ms) only when the words and the sound agree; either in doubt
            # waits ``mid`` (turn.disagree_silence_ms); a trailing function word the longest
            def agree(r: dict[str, Any], th: float = th, lo: float = lo, mid: float = mid) -> float:
                if r["p_words"] <= 0.1:
                    return 900.0
                return lo if r["p_words"] >= th and r["p_audio"] >= th else float(mid)
            out[f"agree>={th} {lo} else {mid}"] = agree
    for hi, mid in ((0.7, 450), (0.8, 500)):
        # the session's rule with a middle wait: one reader at least ``hi`` sure and the other
        # not sure the caller goes on (at least 0.1) waits ``mid``, not 800 ms
        def tiered(r: dict[str, Any], hi: float = hi, mid: float = mid) -> float:
            pw, pa = r["p_words"], r["p_audio"]
            return _session(r, float(mid) if max(pw, pa) >= hi and min(pw, pa) >= 0.1 else 800.0)
        out[f"agree 360, one>={hi} {mid}"] = tiered
    for hi, lo in ((0.8, 200), (0.8, 300), (0.9, 200), (0.9, 300)):
        # the session's rule with a shorter wait when both readers are very sure
        def sure(r: dict[str, Any], hi: float = hi, lo: float = lo) -> float:
            return float(lo) if r["p_words"] >= hi and r["p_audio"] >= hi else _session(r, 800.0)
        out[f"both>={hi} {lo}, agree 360"] = sure
    for look in LATE_LOOKS_MS:
        for th in (0.5, 0.7, 0.9):
            # the session's rule, Smart Turn asked again ``look`` ms into a pause where it had
            # doubted and the words had not: sure now ends the turn once it has answered
            def again(r: dict[str, Any], look: int = look, th: float = th) -> float:
                late = r.get("p_audio_late", {}).get(str(look))
                sure_now = r["p_words"] >= 0.5 and late is not None and late >= th
                return _session(r, look + SMART_TURN_MS if sure_now else 800.0)
            out[f"agree 360, again at {look} >={th}"] = again
    return out


def score(rows: list[dict[str, Any]], fn: Any, notice_ms: float) -> dict[str, Any]:
    mids = [r for r in rows if r["kind"] in ("function", "content", "natural")]
    joins = [r for r in rows if r["kind"] == "join"]
    ends = [fn(r) for r in rows if r["kind"] == "end"]

    def over(r: dict[str, Any]) -> bool:
        return fn(r) < r["d_ms"] + notice_ms

    return {
        "cutoffs_function": sum(over(r) for r in mids if r["kind"] == "function"),
        "cutoffs_content": sum(over(r) for r in mids if r["kind"] == "content"),
        "cutoffs_natural": sum(over(r) for r in mids if r["kind"] == "natural"),
        "mid_pauses": len(mids),
        "joins_talked_over": sum(over(r) for r in joins), "joins": len(joins),
        "end_wait_p50_ms": round(statistics.median(ends), 1) if ends else None,
        "end_wait_p95_ms": round(float(np.percentile(ends, 95)), 1) if ends else None,
        "end_wait_mean_ms": round(float(np.mean(ends)), 1) if ends else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="dev", choices=("dev", "test"))
    ap.add_argument("--notice-ms", type=float, default=10.0)
    ap.add_argument("--features", type=Path, help="reuse features saved by an earlier run (or its --json)")
    ap.add_argument("--turn-end-lm", type=Path, help="read the words' LM opinion from this turn-end LM "
                    "(`python -m llm.turn_end_lm`) instead of the probe")
    ap.add_argument("--lm-min-words", type=int, default=1, help="with --turn-end-lm: no LM opinion on fewer words")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.features and args.features.exists():
        rows = json.loads(args.features.read_text())
        if isinstance(rows, dict):  # an earlier --json output
            rows = rows["rows"]
        add_late_audio(rows, args.split)
    else:
        rows = features(load_calls(args.split))
        if args.features:
            args.features.write_text(json.dumps(rows))
    if args.turn_end_lm:
        rows = reread_words(rows, args.turn_end_lm, args.lm_min_words)
    table = {name: score(rows, fn, args.notice_ms) for name, fn in policies().items()}
    print(f"\n{args.split}: {sum(r['kind'] == 'end' for r in rows)} turn ends, "
          f"{sum(r['kind'] in ('function', 'content', 'natural') for r in rows)} pauses inside turns, "
          f"{sum(r['kind'] == 'join' for r in rows)} joins (notice {args.notice_ms:.0f} ms)")
    print(f"{'policy':26s} {'cut fn':>6s} {'cut ct':>6s} {'cut nat':>7s} {'joins':>6s} "
          f"{'p50':>7s} {'p95':>7s} {'mean':>7s}")
    for name, s in table.items():
        print(f"{name:26s} {s['cutoffs_function']:6d} {s['cutoffs_content']:6d} {s['cutoffs_natural']:7d} "
              f"{s['joins_talked_over']:3d}/{s['joins']:<2d} "
              f"{s['end_wait_p50_ms']:7.1f} {s['end_wait_p95_ms']:7.1f} {s['end_wait_mean_ms']:7.1f}")
    if args.json:
        args.json.write_text(json.dumps({"split": args.split, "notice_ms": args.notice_ms,
                                         "turn_end_lm": str(args.turn_end_lm) if args.turn_end_lm else None,
                                         "lm_min_words": args.lm_min_words,
                                         "policies": table,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

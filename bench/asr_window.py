"""ASR encoder window: cost and WER of short padded windows against faster-whisper's 30 s
window, measured in the same run on real recordings (LibriVox clips, JFK, the card clips).

    python bench/asr_window.py [--repeats 3] [--json PATH]

Prints, per window, the median seconds per utterance, the WER against the reference
transcripts, how often the loop guard fell back to 30 s, and the speed ratio vs 30 s.

The ``auto+draft`` row is the final transcript as the streaming ASR makes it: the adaptive
window, with the hypothesis of a partial taken 0.4 s before the end (itself drafted from one
0.4 s before that) handed to the torch decoder as a draft (``asr.draft_decoder``). Only the
final call is timed. The other rows use CTranslate2's decoder (no draft).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pipelines.config import AsrConfig  # noqa: E402
from tests import speech  # noqa: E402
from tests.wer import wer, words  # noqa: E402
from voice.asr import WhisperEngine  # noqa: E402
from voice.audio import read_wav  # noqa: E402


def corpus_wer(pairs: list[tuple[str, str]]) -> float:
    errs = sum(wer(r, h) * len(words(r)) for r, h in pairs)
    return errs / max(1, sum(len(words(r)) for r, _ in pairs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", default="30,15,10,8,auto,auto+draft",
                    help="comma-separated seconds; 'auto' = the adaptive window (min_window_s..window_s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preroll", type=float, default=0.2,
                    help="seconds of silence before each clip, as the session's pre-roll buffer adds (default 0.2)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--min-window", type=float, help="asr.min_window_s for the 'auto' row (default: the config's)")
    args = ap.parse_args()
    eng = WhisperEngine(AsrConfig() if args.min_window is None else AsrConfig(min_window_s=args.min_window))
    eng.warmup()
    clips = [speech.jfk(), *speech.librivox(), *speech.cards()]
    lead = np.zeros(int(args.preroll * 16000), np.float32)
    audio = [(c.text, np.concatenate([lead, read_wav(c.path, 16000)[0].astype(np.float32) / 32768])) for c in clips]
    rows = []
    for spec in args.windows.split(","):
        w = None if spec.startswith("auto") else float(spec)
        times, pairs, fallbacks, used, delooped = [], [], 0, [], 0
        for ref, a in audio:
            per, draft = [], None
            if spec == "auto+draft":
                early = eng.transcribe(a[: max(1600, len(a) - 12800)]).text
                draft = eng.transcribe(a[: max(1600, len(a) - 6400)], draft=early).text
            for _ in range(args.repeats):
                r = eng.transcribe(a, window_s=w, draft=draft)
                per.append(r.seconds)
            times.append(statistics.median(per))
            pairs.append((ref, r.text))
            fallbacks += int(r.fell_back)
            delooped += int(r.delooped)
            used.append(r.window_s)
        rows.append({"window_s": spec if w is None else w, "windows_used": used, "median_s": statistics.median(times),
                     "mean_s": statistics.fmean(times), "wer": corpus_wer(pairs),
                     "fallbacks": fallbacks, "delooped": delooped, "utterances": len(audio),
                     "texts": [h for _, h in pairs]})
    base = next(r for r in rows if r["window_s"] == 30.0)
    print(f"{'window':>7} {'median s':>9} {'mean s':>7} {'x faster':>9} {'WER':>6} {'fallbacks':>9} {'delooped':>8}")
    for r in rows:
        r["speedup_vs_30s"] = base["median_s"] / r["median_s"]
        print(f"{r['window_s']!s:>7} {r['median_s']:>9.3f} {r['mean_s']:>7.3f} {r['speedup_vs_30s']:>9.2f} "
              f"{r['wer']:>6.3f} {r['fallbacks']:>5}/{r['utterances']} {r['delooped']:>8}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

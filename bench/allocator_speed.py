"""What the allocator settings (`pipelines.allocator`) cost the engines' hot calls.

    python bench/allocator_speed.py --rounds 3 --json bench/results/allocator_speed_cpu.json

Each round starts two fresh child processes one after the other, glibc's defaults
(``VOICE_AGENT_MALLOC=default``) and the agent's settings, in alternating order. Each child
loads Whisper, the reply model and Piper, warms them, then times 20 calls of each: a 3 s
Whisper window, one reply (no deadline) and one sentence of speech. A fixed mmap threshold
sends every buffer above it to mmap, which costs page faults; this measures whether that
shows. Prints each engine's median ms per setting and the ratio tuned / default (medians
over the rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "I'm calling about my order.", "Can I speak to a real person?", "I forgot my password again.",
    "What time do you open tomorrow?", "I need to change my booking.", "Is anybody there?",
    "My card was charged twice.", "Thanks, that's all for today.", "Can you hear me?", "I want to cancel.",
]


def child(reps: int) -> dict[str, float]:
    from llm.config import LlmConfig
    from llm.responder import Responder
    from pipelines.allocator import tune_allocator
    from voice.asr import WhisperEngine
    from voice.audio import int16_to_float, read_wav
    from voice.tts import PiperTTS

    tuned = tune_allocator()
    pcm, _ = read_wav(ROOT / "examples" / "call.wav", target_rate=16000)  # int16 mono
    clip = int16_to_float(pcm[16000 : 16000 * 4])
    asr, lm, tts = WhisperEngine(), Responder.load(LlmConfig(), turn_end=False), PiperTTS()
    asr.warmup()
    lm.generate(PROMPTS[0])
    tts.synth("Hello there.")
    times: dict[str, list[float]] = {"asr": [], "lm": [], "tts": []}
    for i in range(reps):
        t = time.perf_counter()
        asr.transcribe(clip)
        times["asr"].append(time.perf_counter() - t)
        t = time.perf_counter()
        lm.generate(PROMPTS[i % len(PROMPTS)])
        times["lm"].append(time.perf_counter() - t)
        tts._cache.clear()
        t = time.perf_counter()
        tts.synth(f"Sure, I can help with order number {i}.")
        times["tts"].append(time.perf_counter() - t)
    out = {k: round(statistics.median(v) * 1000, 2) for k, v in times.items()}
    return {**out, "tuned": tuned}


def run_child(tuned: bool, reps: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["VOICE_AGENT_MALLOC"] = "agent" if tuned else "default"
    out = subprocess.run([sys.executable, __file__, "--child", str(reps)], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    runs: dict[str, list[dict[str, float]]] = {"default": [], "tuned": []}
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for tuned in order:
            res = run_child(tuned, args.reps)
            if res["tuned"] != tuned:
                raise SystemExit(f"child did not apply the setting it was asked for: {res}")
            runs["tuned" if tuned else "default"].append(res)
            print(f"round {r + 1} {'tuned' if tuned else 'default'}: {res}", flush=True)
    summary = {}
    for eng in ("asr", "lm", "tts"):
        d = statistics.median(x[eng] for x in runs["default"])
        t = statistics.median(x[eng] for x in runs["tuned"])
        summary[eng] = {"default_ms": d, "tuned_ms": t, "ratio": round(t / d, 3)}
        print(f"{eng}: default {d:.1f} ms, tuned {t:.1f} ms, ratio {t / d:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": runs, "reps": args.reps}, indent=2))


if __name__ == "__main__":
    main()

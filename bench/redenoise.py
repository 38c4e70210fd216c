"""Incremental re-denoising vs regenerating, when the caller's partial transcript grows.

    python bench/redenoise.py [--n 40] [--json PATH]

For held-out prompts, the partial is the prompt without its last 1-2 words and the final is
the whole prompt. Cold: a fresh block for the final. Warm: the block already decoded for the
partial is kept, its low-confidence and changed positions are re-masked (`redenoise`), and
only those are decoded. Reports median wall time and denoising passes of both, the share of
positions re-masked, the token F1 of the warm reply against the cold one (how much the
shortcut changes the answer), and both replies' token F1 against the held-out reference (whether
it costs quality). Medians over prompts, 1 torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from llm.config import MDLM_DECODING, LlmConfig  # noqa: E402
from llm.data import all_pairs, split_pairs  # noqa: E402
from llm.loader import EMBEDDED_MDLM  # noqa: E402
from llm.responder import Responder  # noqa: E402


def token_f1(a: str, b: str) -> float:
    x, y = a.lower().split(), b.lower().split()
    if not x or not y:
        return float(x == y)
    common = sum(min(x.count(w), y.count(w)) for w in set(x))
    if common == 0:
        return 0.0
    p, r = common / len(x), common / len(y)
    return 2 * p * r / (p + r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    r = Responder.load(LlmConfig(model_path=str(EMBEDDED_MDLM), **MDLM_DECODING))  # re-denoising is the MDLM's
    _, held = split_pairs(all_pairs(1234), 300, 1234)
    pairs = [p for p in held if 4 <= len(p.prompt.split()) <= 25][: args.n]
    cold_t, warm_t, cold_steps, warm_steps, remask_share, agree = [], [], [], [], [], []
    cold_ref, warm_ref = [], []
    for pair in pairs:
        prompt = pair.prompt
        words = prompt.split()
        partial = " ".join(words[: -min(2, len(words) // 3)])
        prev = r.generate(partial)
        t0 = time.perf_counter()
        cold = r.generate(prompt)
        cold_t.append(time.perf_counter() - t0)
        cold_steps.append(cold.stats.steps)
        t0 = time.perf_counter()
        warm = r.redenoise(prev, prompt)
        warm_t.append(time.perf_counter() - t0)
        warm_steps.append(warm.stats.steps + 1)  # +1: the scoring pass that picks positions
        remask_share.append(warm.remasked / r.cfg.block_len)
        agree.append(token_f1(warm.text, cold.text))
        cold_ref.append(token_f1(cold.text, pair.response))
        warm_ref.append(token_f1(warm.text, pair.response))
    out = {
        "prompts": len(pairs),
        "cold_median_ms": round(1000 * statistics.median(cold_t), 1),
        "warm_median_ms": round(1000 * statistics.median(warm_t), 1),
        "speedup": round(statistics.median(cold_t) / statistics.median(warm_t), 2),
        "cold_median_passes": statistics.median(cold_steps),
        "warm_median_passes": statistics.median(warm_steps),
        "remasked_share_median": round(statistics.median(remask_share), 3),
        "warm_vs_cold_token_f1_mean": round(statistics.mean(agree), 3),
        "cold_f1_vs_reference": round(statistics.mean(cold_ref), 3),
        "warm_f1_vs_reference": round(statistics.mean(warm_ref), 3),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

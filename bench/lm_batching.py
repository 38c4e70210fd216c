"""Would batching the LM's denoising passes across calls pay on this box? Two measurements:

    python bench/lm_batching.py [--calls 4] [--rounds 2] [--json PATH]

1. What one denoising pass of the embedded block-diffusion model costs at batch 1, 2 and 4: a
   block of 8 positions plus the block's first causal row against a 40-token cache, the shape
   of a reply's passes (median of 200, at 1 and 2 torch threads).
2. How often concurrent calls' LM work could share a pass at all: N calls of the evaluation
   set's test split replayed at once through `replay --concurrent` (real-time pace, default
   config), every reply decode timed (start, end, call). For each decode: did another call's
   decode run at the same time? A scheduler that collects requests for a few ms can only merge
   decodes that overlap.

The estimate of what batching would save is the overlapped decode time times (1 - cost of a
batch-2 pass / cost of two batch-1 passes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from eval_calls import load_calls  # noqa: E402


def pass_cost_ms(model: Any, batch: int, past: int = 40, q: int = 9, reps: int = 200) -> float:
    import torch
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    with torch.no_grad():
        prefix = torch.randint(0, vocab - 10, (batch, past))
        blk = torch.randint(0, vocab - 10, (batch, q))
        mask = torch.ones((batch, 1, q, past + q), dtype=torch.bool)
        pos = torch.arange(past, past + q)[None].expand(batch, -1)
        times = []
        for _ in range(reps):
            cache = DynamicCache()
            model.transformer(input_ids=prefix, cache=cache, use_cache=True)
            t = time.perf_counter()
            h = model.transformer(input_ids=blk, attention_mask=mask, position_ids=pos, cache=cache,
                                  use_cache=True).last_hidden_state
            model.lm_head(h).float().softmax(-1)
            times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1000, 3)


def overlap_stats(spans: list[tuple[float, float, int]]) -> dict[str, Any]:
    """spans: (start, end, caller thread's call id). A decode overlaps when another call's
    decode was running at some moment of it."""
    over = []
    for i, (s, e, c) in enumerate(spans):
        over.append(any(c2 != c and s2 < e and s < e2 for j, (s2, e2, c2) in enumerate(spans) if j != i))
    busy = sum(e - s for s, e, _ in spans)
    shared = sum(e - s for (s, e, _), o in zip(spans, over, strict=True) if o)
    return {"decodes": len(spans), "overlapping": sum(over),
            "decode_ms_median": round(statistics.median([(e - s) * 1000 for s, e, _ in spans]), 1) if spans else None,
            "decode_s_total": round(busy, 2), "overlapping_s": round(shared, 2)}


async def concurrent_spans(n: int, rounds: int) -> tuple[list[tuple[float, float, int]], float]:
    import pipelines.replay_concurrent as replay_concurrent_mod
    from pipelines.agent import Agent
    from pipelines.config import AgentConfig
    from pipelines.replay import replay_pcm
    from pipelines.replay_concurrent import CallInput, replay_concurrent
    from voice.audio import read_wav

    cfg = AgentConfig()
    cfg.cache.enabled = False
    cfg.agent.max_calls = max(cfg.agent.max_calls, n)
    agent = await Agent.load(cfg)
    responder = agent.responder
    spans: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    which = contextvars.ContextVar("call", default=-1)
    seq = itertools.count()
    generate = responder.generate

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.monotonic()
        try:
            return generate(*a, **kw)
        finally:
            with lock:  # the worker runs in the asking call's context (`voice.workers`)
                spans.append((t, time.monotonic(), which.get()))

    async def tagged(*a: Any, **kw: Any) -> Any:
        which.set(next(seq))  # this call's task, and every task and job it starts
        return await replay_pcm(*a, **kw)

    responder.generate = timed  # type: ignore[method-assign]
    replay_concurrent_mod.replay_pcm = tagged  # type: ignore[attr-defined]
    calls = load_calls("test")
    wall = 0.0
    try:
        for r in range(rounds):
            rnd = calls[r * n : (r + 1) * n]
            inputs = []
            for c in rnd:
                pcm, rate = read_wav(c["wav"])
                inputs.append(CallInput(c["id"], Path(c["wav"]), pcm, rate))
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.monotonic()
                await replay_concurrent(agent, inputs, Path(tmp), Path(tmp))
                wall += time.monotonic() - t0
    finally:
        await agent.aclose()
    return spans, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=4, help="simultaneous calls")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import torch

    from llm.config import LlmConfig
    from llm.loader import load_lm

    model = load_lm(LlmConfig()).model.eval()
    costs: dict[str, dict[str, float]] = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        costs[f"{threads} thread(s)"] = {f"batch {b}": pass_cost_ms(model, b) for b in (1, 2, 4)}
    torch.set_num_threads(1)
    print(json.dumps(costs, indent=2), flush=True)
    spans, wall = asyncio.run(concurrent_spans(args.calls, args.rounds))
    one = costs["1 thread(s)"]
    saving = 1 - one["batch 2"] / (2 * one["batch 1"])
    ov = overlap_stats(spans)
    out = {"pass_cost_ms": costs, "concurrent": {"calls": args.calls, "rounds": args.rounds, "wall_s": round(wall, 1),
                                                 **ov},
           "batch2_saving": round(saving, 3),
           "estimated_saving_s": round(ov["overlapping_s"] * saving, 2),
           # of the two cores' time over the run
           "estimated_saving_share": round(ov["overlapping_s"] * saving / (2 * wall), 4) if wall else None}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""Draft-and-verify decoding of the BDLM (`llm.draft_verify`) against its threshold decoder:
tokens committed per pass, reply length, and agreement with a plain greedy causal loop.

    .venv/bin/python bench/draft_verify.py [--json PATH]    # the dev caller lines
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm.config import LlmConfig  # noqa: E402
from llm.draft_verify import _pick, generate_verified  # noqa: E402
from llm.responder import Responder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    r = Responder.load(LlmConfig(), turn_end=False)
    dec = r.blocks
    src = Path(__file__).parent / "data" / "caller_dev.txt"
    lines = [s.strip() for s in src.read_text().splitlines() if s.strip()]
    rows = []
    for text in lines:
        prompt, opts = r._prompt(text), r.block_options()
        v = generate_verified(dec, prompt, opts)
        b = dec.generate(prompt, opts)
        greedy: list[int] = []  # the causal reading, one full forward per token
        with torch.no_grad():
            for _ in range(opts.max_tokens):
                h = r.lm.model.transformer(input_ids=torch.tensor([prompt + greedy])).last_hidden_state[0]
                tok, _ = _pick(dec, dec._probs(h[-1:])[0], greedy, opts)
                if tok in dec.special.end_ids:
                    break
                greedy.append(tok)
        rows.append({"prompt": text, "verified": r.lm.decode(v.ids), "threshold": r.lm.decode(b.ids),
                     "verified_passes": v.stats.steps, "threshold_passes": b.stats.steps,
                     "verified_tokens_per_pass": (len(v.ids) + 1) / v.stats.steps,
                     "threshold_tokens_per_pass": (len(b.ids) + 1) / b.stats.steps,
                     "same_as_greedy": v.ids == greedy})
    med = lambda k: round(statistics.median(x[k] for x in rows), 3)  # noqa: E731
    words = lambda k: statistics.median(len(x[k].split()) for x in rows)  # noqa: E731
    out = {"lines": len(rows), "verified_tokens_per_pass_p50": med("verified_tokens_per_pass"),
           "threshold_tokens_per_pass_p50": med("threshold_tokens_per_pass"),
           "verified_tokens_per_pass_mean": round(statistics.mean(x["verified_tokens_per_pass"] for x in rows), 3),
           "verified_words_p50": words("verified"), "threshold_words_p50": words("threshold"),
           "same_as_greedy": sum(x["same_as_greedy"] for x in rows)}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**out, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

"""Self-distillation data for the BDLM: the embedded model's own replies to training prompts.

    python scripts/distill_replies.py --workers 2        # about 20 minutes on two cores

Each training-side prompt (SGD caller turns, chit-chat, the persona slice; never a held-out
one) is answered by the reply model at its default setting with no deadline. A reply is kept
when it ended within the token cap, has at most 24 words, says nothing twice and parses under
link-grammar with no null links. Training on these (``llm.train --distill``) gives each prompt
one target instead of the corpora's many different replies, so the model becomes sure of
several positions of a block at once and the threshold rule commits more per pass: the
sequence-level distillation non-autoregressive translation uses for the same reason.

Writes ``llm/corpus/distilled_replies.jsonl.gz``: ``{"k": reply_key(prompt), "reply": text}``
per kept prompt. The prompts stay in their corpora (keyed by hash); the replies are this
repo's model output.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llm.data import DISTILLED_REPLIES, all_pairs, reply_key, sgd_pairs, split_pairs  # noqa: E402
from llm.quality import repeats, words  # noqa: E402
from llm.train import HELDOUT  # noqa: E402

MAX_WORDS = 24

_worker: dict = {}


def _init(model: str | None) -> None:
    import torch

    from llm.config import LlmConfig
    from llm.grammar_judge import LinkGrammarJudge
    from llm.responder import Responder

    torch.set_num_threads(1)
    _worker["r"] = Responder.load(LlmConfig(model_path=model), turn_end=False)
    _worker["judge"] = LinkGrammarJudge()


def _answer(prompts: list[str]) -> list[tuple[str, str | None]]:
    r, judge = _worker["r"], _worker["judge"]
    out: list[tuple[str, str | None]] = []
    for p in prompts:
        rep = r.generate(p)
        t = rep.text.strip()
        ended = len(rep.block) > len(rep.ids)
        ok = ended and bool(t) and len(words(t)) <= MAX_WORDS and not repeats(t) and judge.grammatical(t)
        out.append((p, t if ok else None))
    return out


def training_prompts(n_sgd: int, n_chat: int, seed: int) -> list[str]:
    train, _ = split_pairs(all_pairs(1234), HELDOUT, 1234)
    rng = random.Random(seed)
    persona = sorted({p.prompt for p in train if p.source == "persona"})
    chat = sorted({p.prompt for p in train if p.source != "persona"})
    sgd = sorted({p.prompt for p in sgd_pairs()} - set(persona))
    return persona + rng.sample(sgd, min(n_sgd, len(sgd))) + rng.sample(chat, min(n_chat, len(chat)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="reply model directory (default: the embedded BDLM)")
    ap.add_argument("--sgd", type=int, default=20000, help="SGD caller turns to answer")
    ap.add_argument("--chat", type=int, default=10000, help="chit-chat / chatterbot prompts to answer")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=DISTILLED_REPLIES)
    args = ap.parse_args()

    prompts = training_prompts(args.sgd, args.chat, args.seed)
    chunks = [prompts[i : i + 200] for i in range(0, len(prompts), 200)]
    t0 = time.monotonic()
    kept: dict[str, str] = {}
    done = 0
    with mp.get_context("spawn").Pool(args.workers, _init, (args.model,)) as pool:
        for res in pool.imap_unordered(_answer, chunks):
            done += len(res)
            kept.update((reply_key(p), t) for p, t in res if t is not None)
            print(f"{done}/{len(prompts)} {time.monotonic() - t0:.0f} s, kept {len(kept)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(args.out, "wb", mtime=0) as f:
        for k in sorted(kept):
            f.write((json.dumps({"k": k, "reply": kept[k]}) + "\n").encode())
    print(f"kept {len(kept)} of {len(prompts)} prompts -> {args.out}")


if __name__ == "__main__":
    main()

"""Distillation data for the BDLM: a teacher's replies to training prompts.

    python scripts/distill_replies.py --workers 2        # the reply model itself, about 20 minutes on two cores
    python scripts/distill_replies.py --teacher ar --out llm/corpus/ar_distilled_replies.jsonl.gz   # about 6

Each training-side prompt (SGD caller turns, chit-chat, the persona slice; never a held-out
one) is answered by the teacher with no deadline: the reply model at its default setting, or
the AR baseline greedily (``--teacher ar``). A reply is kept when it ended within the token
cap, has at most 24 words, says nothing twice (nor any word trigram) and parses under
link-grammar with no null links. Training on these (``llm.train --distill [--distill-file]``)
gives each prompt one target instead of the corpora's many different replies, so the model
becomes sure of several positions of a block at once and the threshold rule commits more per
pass: the sequence-level distillation non-autoregressive translation uses for the same reason.

Writes ``llm/corpus/distilled_replies.jsonl.gz`` (or ``--out``): ``{"k": reply_key(prompt),
"reply": text}`` per kept prompt. The prompts stay in their corpora (keyed by hash); the
replies are this repo's model output.
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


def _init(model: str | None, teacher: str) -> None:
    import torch

    from llm.grammar_judge import LinkGrammarJudge

    torch.set_num_threads(1)
    if teacher == "ar":
        from llm.ar import AR_WEIGHTS, ArLM

        _worker["ar"] = ArLM.load(model or AR_WEIGHTS)
    else:
        from llm.config import LlmConfig
        from llm.responder import Responder

        _worker["r"] = Responder.load(LlmConfig(model_path=model), turn_end=False)
    _worker["judge"] = LinkGrammarJudge()


def _replies(prompts: list[str]) -> list[tuple[str, bool]]:
    """(text, ended) per prompt, from the teacher this worker loaded."""
    if "ar" in _worker:
        ar = _worker["ar"]
        out = []
        for i in range(0, len(prompts), 32):  # greedy, batched: rows stop at their own end token
            batch = prompts[i : i + 32]
            for res in ar.generate_batch([ar.prompt_ids(p) for p in batch]):
                out.append((ar.tok.decode(res.ids).strip(), res.ended))
        return out
    reps = [_worker["r"].generate(p) for p in prompts]
    return [(rep.text.strip(), len(rep.block) > len(rep.ids)) for rep in reps]


def _says_a_trigram_twice(text: str) -> bool:
    w = [x.lower().strip(".,!?") for x in text.split()]
    grams = [tuple(w[i : i + 3]) for i in range(len(w) - 2)]
    return len(grams) != len(set(grams))


def _answer(prompts: list[str]) -> list[tuple[str, str | None]]:
    judge = _worker["judge"]
    out: list[tuple[str, str | None]] = []
    for p, (t, ended) in zip(prompts, _replies(prompts), strict=True):
        ok = (ended and bool(t) and len(words(t)) <= MAX_WORDS and not repeats(t)
              and not _says_a_trigram_twice(t) and judge.grammatical(t))
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
    ap.add_argument("--teacher", choices=["bdlm", "ar"], default="bdlm",
                    help="who answers: the reply model at its default setting, or the AR baseline greedily "
                         "(sequence-level distillation from an autoregressive teacher)")
    ap.add_argument("--model", help="the teacher's directory (default: the embedded BDLM, or llm/weights/ar)")
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
    with mp.get_context("spawn").Pool(args.workers, _init, (args.model, args.teacher)) as pool:
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

"""Reply quality on held-out caller utterances, judged by a grammar nobody here wrote.

    .venv/bin/python bench/reply_quality.py                     # test split, about 3 minutes
    .venv/bin/python bench/reply_quality.py --split dev         # the split to tune on
    .venv/bin/python bench/reply_quality.py --json bench/results/reply_quality_cpu.json
    .venv/bin/python bench/reply_quality.py --split dev --sweep 8:0.9,16:0.9,8:0.7   # block:tau settings
    .venv/bin/python bench/reply_quality.py --seeds 5           # the default row under seeds 0-4 too

The utterances: ``bench/data/caller_{dev,test}.txt`` (greetings, requests to a phone
assistant, questions, complaints, small talk, line checks, hand-offs, thanks and goodbyes,
written for this bench) plus caller turns from the Schema-Guided Dialogue corpus's own dev or
test split, whose train split is the only one training reads. Any utterance that is also a
training prompt (compared lower-case, without punctuation) is dropped.

Systems, side by side: the embedded block diffusion LM at the default config, with no
deadline and with the call's committed-path deadline (``budgets.llm_block_ms``); the AR
baseline (greedy, KV cache); the embedded MDLM at its own settings; and SGD's reference
replies where the utterance has one. For each:

- grammatical: every sentence has a full link-grammar linkage with no null links;
- repeat: a word twice in a row or a sentence twice (`llm.quality.repeats`);
- distinct: distinct replies / replies;
- median words;
- judge NLL: per token, under the AR baseline (it favours the AR model's own greedy text);
- relevance: the share of replies more likely under the AR judge given their own prompt than
  given another utterance's (a fixed derangement);
- speed at batch 1: useful tokens (reply + end token) per second, and the ratio against the
  AR baseline timed on the same utterance just before (the median of per-utterance ratios:
  this VM drifts).

The default config samples (``llm.temperature``, seeded per reply by ``llm.seed`` and the
prompt), so its quality columns are one draw: ``--seeds N`` scores the same row under seeds
0..N-1 as well (quality columns only) and gives each column's median.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from llm.ar import ArLM  # noqa: E402
from llm.config import MDLM_DECODING, LlmConfig  # noqa: E402
from llm.data import all_pairs, sgd_pairs  # noqa: E402
from llm.grammar_judge import LinkGrammarJudge  # noqa: E402
from llm.loader import EMBEDDED_MDLM  # noqa: E402
from llm.quality import repeats, words  # noqa: E402
from llm.responder import Responder  # noqa: E402
from pipelines.config import BudgetConfig  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import machine  # noqa: E402

# SGD caller turns held out of training (CC BY-SA 4.0, llm/corpus/SGD-LICENSE.txt), copied out
# of the corpus by scripts/extract_sgd.py
SGD_HELD_OUT = ROOT / "bench" / "data" / "sgd_heldout.jsonl.gz"
SEED = 1234


def _norm(text: str) -> str:
    return " ".join(words(text))


@dataclass
class Utterance:
    text: str
    reference: str | None = None


def sgd_utterances(split: str) -> list[Utterance]:
    """Caller turns of SGD's own ``split`` with the system turn that answered them."""
    if not SGD_HELD_OUT.exists():
        raise SystemExit(f"{SGD_HELD_OUT.relative_to(ROOT)} is missing: run scripts/extract_sgd.py")
    with gzip.open(SGD_HELD_OUT, "rt", encoding="utf-8") as f:
        return [Utterance(d["prompt"], d["reference"]) for d in map(json.loads, f) if d["split"] == split]


def held_out(split: str) -> list[Utterance]:
    trained = {_norm(p.prompt) for p in all_pairs(SEED)} | {_norm(p.prompt) for p in sgd_pairs()}
    own = [Utterance(t.strip()) for t in (ROOT / "bench" / "data" / f"caller_{split}.txt").read_text().splitlines()]
    out, seen = [], set()
    for u in own + sgd_utterances(split):
        k = _norm(u.text)
        if u.text and k not in trained and k not in seen:
            seen.add(k)
            out.append(u)
    return out


@dataclass
class Reply:
    text: str
    ids: list[int]
    ended: bool
    seconds: float
    passes: int


def run_responder(r: Responder, texts: list[str], deadline_s: float | None) -> list[Reply]:
    out = []
    for t in texts:
        rep = r.generate(t, deadline_s=deadline_s)
        out.append(Reply(rep.text, rep.ids, bool(rep.block[len(rep.ids):len(rep.ids) + 1] == [r.lm.special.eot]),
                         rep.stats.total_s, rep.stats.steps))
    return out


def run_ar(ar: ArLM, texts: list[str]) -> list[Reply]:
    out = []
    for t in texts:
        res = ar.generate(ar.prompt_ids(t))
        out.append(Reply(ar.tok.decode(res.ids), res.ids, res.ended, res.total_s, res.steps))
    return out


def score(name: str, texts: list[str], replies: list[str], judge: LinkGrammarJudge, ar: ArLM,
          ids: list[list[int]] | None = None, ended: list[bool] | None = None) -> dict[str, object]:
    n = len(replies)
    tok = ar.tok
    rid = ids if ids is not None else [tok.encode(" " + r) for r in replies]
    end = ended if ended is not None else [True] * n
    prompts = [ar.prompt_ids(t) for t in texts]
    nll = ar.nll(prompts, rid, end)
    # relevance: own prompt against another utterance's (a derangement by rotation)
    other = prompts[1:] + prompts[:1]
    nll_other = ar.nll(other, rid, end)
    relevant = [a < b for a, b in zip(nll, nll_other, strict=True) if a == a and b == b]
    finite = [x for x in nll if x == x]
    return {
        "system": name, "n": n,
        "grammatical": round(sum(judge.grammatical(r) for r in replies) / n, 4),
        "repeat": round(sum(repeats(r) for r in replies) / n, 4),
        "distinct": round(len({_norm(r) for r in replies}) / n, 4),
        "median_words": statistics.median(len(words(r)) for r in replies),
        "judge_nll": round(statistics.fmean(finite), 4) if finite else None,
        "relevance": round(sum(relevant) / len(relevant), 4) if relevant else None,
    }


def speed(replies: list[Reply], base: list[Reply] | None) -> dict[str, object]:
    tps = [(len(r.ids) + int(r.ended)) / r.seconds for r in replies if r.seconds > 0]
    out: dict[str, object] = {
        "tokens_per_s": round(statistics.median(tps), 1),
        "ms_median": round(statistics.median(r.seconds for r in replies) * 1000, 2),
        "passes_median": statistics.median(r.passes for r in replies),
    }
    if base is not None:
        ratios = [((len(r.ids) + int(r.ended)) / r.seconds) / ((len(b.ids) + int(b.ended)) / b.seconds)
                  for r, b in zip(replies, base, strict=True) if r.seconds > 0 and b.seconds > 0]
        out["speed_ratio_vs_ar"] = round(statistics.median(ratios), 3)
    return out


def interleaved(
    ar: ArLM, resp: Responder, texts: list[str], deadline_s: float | None
) -> tuple[list[Reply], list[Reply]]:
    """Each utterance: the AR baseline, then the diffusion LM, back to back."""
    a, d = [], []
    for t in texts:
        a += run_ar(ar, [t])
        d += run_responder(resp, [t], deadline_s)
    return a, d


def sweep(spec: str, base: LlmConfig, texts: list[str], judge: LinkGrammarJudge, ar: ArLM) -> int:
    """Quality and speed of the diffusion LM at several block:tau settings, each interleaved
    with the AR baseline (for choosing the default on the dev split)."""
    run_ar(ar, ["hello"])
    for item in spec.split(","):
        block, tau = item.split(":")
        cfg = base.model_copy(update={"block_len": int(block), "steps": int(block), "tau": float(tau)})
        resp = Responder.load(cfg)
        resp.generate("hello")
        a, d = interleaved(ar, resp, texts, None)
        row = {**score(f"block {block} tau {tau} ({cfg.dtype})", texts, [r.text for r in d], judge, ar,
                       [r.ids for r in d], [r.ended for r in d]), **speed(d, a)}
        print(json.dumps(row), flush=True)
    return 0


QUALITY_COLUMNS = ("grammatical", "repeat", "distinct", "median_words", "judge_nll", "relevance")


def seed_rows(base: LlmConfig, texts: list[str], judge: LinkGrammarJudge, ar: ArLM, n: int) -> list[dict]:
    """The diffusion LM's quality columns under ``llm.seed`` 0..n-1 (the config otherwise as
    given), printed with each column's median."""
    rows = []
    resp = Responder.load(base, turn_end=False)
    for seed in range(n):
        resp.cfg = base.model_copy(update={"seed": seed})  # the seed is read per reply
        d = run_responder(resp, texts, None)
        row = score(f"block diffusion, seed {seed}", texts, [r.text for r in d], judge, ar,
                    [r.ids for r in d], [r.ended for r in d])
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(json.dumps({"seed_medians": medians(rows)}))
    return rows


def medians(rows: list[dict]) -> dict[str, float]:
    return {c: statistics.median(r[c] for r in rows) for c in QUALITY_COLUMNS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=["dev", "test"], default="test")
    ap.add_argument("--config", help="agent config for the diffusion LM (default: built-in defaults)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--samples", type=int, default=8, help="sample replies printed and kept per system")
    ap.add_argument("--no-mdlm", action="store_true", help="leave the MDLM row out")
    ap.add_argument("--sweep", help="instead of the table: block:tau settings of the diffusion LM, e.g. 8:0.9,16:0.7")
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], help="the diffusion LM's dtype")
    ap.add_argument("--seeds", type=int, default=0,
                    help="also score the default row under llm.seed 0..N-1 (quality only) and their medians")
    args = ap.parse_args()
    torch.set_num_threads(1)

    utts = held_out(args.split)
    texts = [u.text for u in utts]
    print(f"{len(texts)} held-out utterances ({args.split})", flush=True)
    if args.config:
        from pipelines.config import load_config

        cfg = load_config(args.config)
        llm_cfg, budgets = cfg.llm, cfg.budgets
    else:
        llm_cfg, budgets = LlmConfig(), BudgetConfig()
    if args.dtype:
        llm_cfg = llm_cfg.model_copy(update={"dtype": args.dtype})
    judge = LinkGrammarJudge()
    ar = ArLM.load()
    if args.sweep:
        return sweep(args.sweep, llm_cfg, texts, judge, ar)
    resp = Responder.load(llm_cfg)
    resp.generate("hello")
    run_ar(ar, ["hello"])

    t0 = time.perf_counter()
    ar_free, bd_free = interleaved(ar, resp, texts, None)
    ar_dl, bd_dl = interleaved(ar, resp, texts, budgets.llm_block_ms / 1000.0)
    rows = [
        {**score("block diffusion (default)", texts, [r.text for r in bd_free], judge, ar,
                 [r.ids for r in bd_free], [r.ended for r in bd_free]), **speed(bd_free, ar_free)},
        {**score(f"block diffusion, {budgets.llm_block_ms} ms deadline", texts, [r.text for r in bd_dl], judge, ar,
                 [r.ids for r in bd_dl], [r.ended for r in bd_dl]), **speed(bd_dl, ar_dl)},
        {**score("AR baseline", texts, [r.text for r in ar_free], judge, ar,
                 [r.ids for r in ar_free], [r.ended for r in ar_free]), **speed(ar_free, None)},
    ]
    samples = {rows[0]["system"]: bd_free, rows[2]["system"]: ar_free}
    if not args.no_mdlm:
        mdlm = Responder.load(LlmConfig(model_path=str(EMBEDDED_MDLM), **MDLM_DECODING))
        md = run_responder(mdlm, texts, None)
        rows.append({**score("MDLM (previous embedded model)", texts, [r.text for r in md], judge, ar,
                             [r.ids for r in md], [r.ended for r in md]), **speed(md, None)})
        samples[rows[-1]["system"]] = md
    refs = [(u.text, u.reference) for u in utts if u.reference]
    if refs:
        rows.append(score("SGD reference replies", [t for t, _ in refs], [r for _, r in refs], judge, ar))

    cols = ["grammatical", "repeat", "distinct", "median_words", "judge_nll", "relevance", "tokens_per_s",
            "speed_ratio_vs_ar", "ms_median"]
    print("| system | n | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for r in rows:
        print(f"| {r['system']} | {r['n']} | " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    seed_runs = seed_rows(llm_cfg, texts, judge, ar, args.seeds) if args.seeds else []
    pick = list(range(0, len(texts), max(1, len(texts) // args.samples)))[: args.samples]
    sample_rows = [{"prompt": texts[i], **{k: v[i].text for k, v in samples.items()}} for i in pick]
    for s in sample_rows:
        print(json.dumps(s, ensure_ascii=False))
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        out = {
            "split": args.split, "utterances": len(texts), "seconds": round(time.perf_counter() - t0, 1),
            "date": time.strftime("%Y-%m-%d"), "commit": commit.stdout.strip(), "machine": machine.cpu(),
            "llm_config": llm_cfg.model_dump(mode="json"), "rows": rows,
            "samples": sample_rows,
        }
        if seed_runs:
            out["seed_runs"] = seed_runs
            out["seed_medians"] = medians(seed_runs)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

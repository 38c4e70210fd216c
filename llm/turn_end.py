"""The language model's own probability that the caller's turn is complete.

The MDLM is trained to answer, not to predict the caller's next word, so this is a probe: a
logistic regression on the model's hidden state at the ``<agent>`` position (where the reply
starts), trained on the training split's prompts: whole prompts are complete, cuts at a random
word are not. The prompt is read alone, without the masked reply block decoding puts after it:
that is a third cheaper (10.6 vs 16.4 ms for a 7-word turn on this CPU, float32) and reads
better (held-out AUC 0.797 vs 0.767 on random cuts, 0.643 vs 0.579 on length-matched pairs).
Trailing punctuation is stripped on both sides, so the probe judges the words (Whisper puts a
full stop after fragments too; the endpointer reads punctuation itself). Whole and cut texts
are weighted to weigh the same at every length, so their count alone does not decide: short
answers ("yes", "10 of clubs") read as whole, short fragments ("I need") do not.

    python -m llm.turn_end --model llm/weights/mdlm      # ~1 min on the CPU; writes turn_end.json

The probe lives next to the weights (``turn_end.json``); a model without one has no LM opinion
and the endpointer falls back to punctuation and function words.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llm.config import LlmConfig
from llm.loader import LoadedLM, load_lm

PROBE_FILE = "turn_end.json"
_TRAIL = re.compile(r"[\s.?!,;:…-]+$")


def strip_trailing_punct(text: str) -> str:
    return _TRAIL.sub("", text.strip())


def hidden_at_reply_start(
    lm: LoadedLM, texts: list[str], prompt_len: int, block_len: int, body: torch.nn.Module | None = None
) -> torch.Tensor:
    """(N, hidden) states at the last prompt position, followed by ``block_len`` masked reply
    positions as in decoding (0: the prompt alone). ``body``: the encoder to run (default:
    ``lm.model.model``)."""
    body = body if body is not None else getattr(lm.model, "model", None)
    if body is None:
        raise ValueError(f"{lm.path}: the probe needs a ModernBERT-style model with a .model encoder")
    prompts = [lm.prompt_ids(strip_trailing_punct(t), [], prompt_len) for t in texts]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(texts), width + block_len), lm.special.pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left-padded, so every prompt ends at the same column
        ids[i, width - len(p) : width] = torch.tensor(p)
        ids[i, width:] = lm.special.mask
        attn[i, width - len(p) :] = 1
    with torch.no_grad():
        h = body(input_ids=ids, attention_mask=attn).last_hidden_state
    return h[:, width - 1].float()


@dataclass
class TurnEndProbe:
    weight: torch.Tensor  # (hidden,)
    bias: float
    mean: torch.Tensor  # feature standardisation
    std: torch.Tensor
    prompt_len: int
    block_len: int
    heldout_auc: float | None = None  # whole vs cut at a random word
    heldout_auc_length_matched: float | None = None  # whole vs a longer prompt cut to its length
    # the encoder in float32, for a model that runs in another dtype (see `prepare`)
    _body32: torch.nn.Module | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, model_dir: Path) -> TurnEndProbe | None:
        f = Path(model_dir) / PROBE_FILE
        if not f.exists():
            return None
        d = json.loads(f.read_text())
        return cls(torch.tensor(d["weight"]), float(d["bias"]), torch.tensor(d["mean"]), torch.tensor(d["std"]),
                   int(d["prompt_len"]), int(d["block_len"]), d.get("heldout_auc"),
                   d.get("heldout_auc_length_matched"))

    def save(self, model_dir: Path, extra: dict[str, object]) -> None:
        d = {"weight": self.weight.tolist(), "bias": self.bias, "mean": self.mean.tolist(), "std": self.std.tolist(),
             "prompt_len": self.prompt_len, "block_len": self.block_len, "heldout_auc": self.heldout_auc,
             "heldout_auc_length_matched": self.heldout_auc_length_matched, **extra}
        (Path(model_dir) / PROBE_FILE).write_text(json.dumps(d))

    def prepare(self, lm: LoadedLM) -> None:
        """Called once when the model is loaded. The probe was fitted on float32 features, and
        bfloat16 moves them enough to matter ("He was not an ill-disposed young man." reads 0.63
        in float32, 0.47 in bfloat16), so for a model running in another dtype the encoder is
        loaded again from the same directory in float32 (a cast of the bfloat16 weights would
        keep their rounding): 27 MB for the embedded model."""
        body = getattr(lm.model, "model", None)
        if body is not None and next(body.parameters()).dtype != torch.float32:
            self._body32 = load_lm(LlmConfig(model_path=str(lm.path), kind=lm.kind, dtype="float32")).model.model

    def probs(self, lm: LoadedLM, texts: list[str]) -> list[float]:
        h = hidden_at_reply_start(lm, texts, self.prompt_len, self.block_len, self._body32)
        x = (h - self.mean) / self.std
        return torch.sigmoid(x @ self.weight + self.bias).tolist()


def auc(scores: list[float], labels: list[int]) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / max(1, len(pos) * len(neg))


def examples(prompts: list[str], rng: random.Random) -> tuple[list[str], list[int]]:
    """Each prompt once whole (complete) and once cut after a random word (not complete)."""
    texts, labels = [], []
    for p in prompts:
        words = strip_trailing_punct(p).split()
        if len(words) < 2:
            continue
        texts.append(" ".join(words))
        labels.append(1)
        texts.append(" ".join(words[: rng.randint(1, len(words) - 1)]))
        labels.append(0)
    return texts, labels


LENGTH_BUCKETS = ((1, 1), (2, 2), (3, 3), (4, 4), (5, 6), (7, 9), (10, 14), (15, 24), (25, 10**9))


def _bucket(n_words: int) -> int:
    return next(i for i, (lo, hi) in enumerate(LENGTH_BUCKETS) if lo <= n_words <= hi)


def length_balanced_weights(texts: list[str], labels: list[int]) -> list[float]:
    """Example weights under which whole and cut texts weigh the same at every length.

    A random cut is always shorter than its prompt, and the chat corpus's prompts are long
    (joined messages), so unweighted, "short" alone reads as "cut": "yes" gets 0.11, "10 of
    clubs" 0.43. With these weights the words, not their count, decide ("yes" 0.80, "10 of
    clubs" 0.65; docs/llm.md has the measurements). Lengths where one class is missing get
    weight 0."""
    keys = [(_bucket(len(t.split())), y) for t, y in zip(texts, labels, strict=True)]
    count = Counter(keys)
    return [(count[(b, y)] + count[(b, 1 - y)]) / (2 * count[(b, y)]) if count[(b, 1 - y)] else 0.0
            for b, y in keys]


def length_matched(prompts: list[str], rng: random.Random) -> tuple[list[str], list[int]]:
    """Each prompt whole, against another, longer prompt cut to the same number of words: what
    the words say, with their count no help."""
    words = [strip_trailing_punct(p).split() for p in prompts]
    words = [w for w in words if w]
    texts, labels = [], []
    for w in words:
        longer = [v for v in words if len(v) > len(w)]
        if longer:
            texts += [" ".join(w), " ".join(rng.choice(longer)[: len(w)])]
            labels += [1, 0]
    return texts, labels


def fit_logistic(x: torch.Tensor, labels: list[int], weights: list[float], max_iter: int = 300,
                 l2: float = 0.0) -> tuple[torch.Tensor, float]:
    """Weighted logistic regression on features ``x`` (N, D) by L-BFGS: (weight (D,), bias)."""
    yt = torch.tensor(labels, dtype=torch.float32)
    wt = torch.tensor(weights)
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=0.5, max_iter=max_iter)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        per = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, yt, reduction="none")
        loss = (per * wt).sum() / wt.sum() + l2 * (w**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), float(b.detach())


def train_probe(lm: LoadedLM, train_prompts: list[str], held_prompts: list[str], prompt_len: int = 32,
                block_len: int = 0, seed: int = 1234, epochs: int = 300,
                balance_length: bool = True) -> TurnEndProbe:
    rng = random.Random(seed)
    x_texts, y = examples(train_prompts, rng)
    feats = torch.cat([hidden_at_reply_start(lm, x_texts[i : i + 256], prompt_len, block_len)
                       for i in range(0, len(x_texts), 256)])
    mean, std = feats.mean(0), feats.std(0).clamp_min(1e-4)
    x = (feats - mean) / std
    torch.manual_seed(seed)
    w, b = fit_logistic(x, y, length_balanced_weights(x_texts, y) if balance_length else [1.0] * len(y),
                        max_iter=epochs, l2=1e-3)
    probe = TurnEndProbe(w, b, mean, std, prompt_len, block_len)
    h_texts, h_y = examples(held_prompts, random.Random(seed + 1))
    probe.heldout_auc = round(auc(probe.probs(lm, h_texts), h_y), 4)
    m_texts, m_y = length_matched(held_prompts, random.Random(seed + 2))
    probe.heldout_auc_length_matched = round(auc(probe.probs(lm, m_texts), m_y), 4)
    return probe


def main(argv: list[str] | None = None) -> int:
    from llm.data import all_pairs, split_pairs
    from llm.train import HELDOUT, PROMPT_LEN

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(__file__).parent / "weights" / "mdlm")
    ap.add_argument("--n", type=int, default=6000, help="training prompts")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--unbalanced", action="store_true",
                    help="do not weigh whole and cut texts the same at every length: the probe then reads the word "
                         "count too, and short answers as unfinished (docs/llm.md)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.monotonic()
    lm = load_lm(LlmConfig(model_path=str(args.model), dtype="float32"))  # the probe reads float32 features
    # the same split as llm.train: the held-out prompts are never used to fit the probe
    train, held = split_pairs(all_pairs(args.seed), HELDOUT, args.seed)
    rng = random.Random(args.seed)
    prompts = [p.prompt for p in rng.sample(train, min(args.n, len(train)))]
    probe = train_probe(lm, prompts, [p.prompt for p in held], PROMPT_LEN, seed=args.seed,
                        balance_length=not args.unbalanced)
    probe.save(args.model, {"train_prompts": len(prompts), "heldout_prompts": len(held), "seed": args.seed,
                            "length_balanced": not args.unbalanced})
    print(f"turn-end probe: held-out AUC {probe.heldout_auc} ({len(held)} prompts, whole vs cut at a random word), "
          f"{probe.heldout_auc_length_matched} (length-matched), {time.monotonic() - t0:.0f} s; "
          f"wrote {args.model / PROBE_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

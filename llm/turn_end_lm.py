"""A causal language model of what people say on the phone, read for the end of a turn.

LiveKit's turn detector is a small causal LM asked how likely its end-of-utterance token is
after the words so far. This is that idea at this repo's scale: the AR baseline's GPT-2
(`llm/weights/ar`, 6.7M parameters) fine-tuned on whole utterances, ``<bos> words <agent>``,
with the loss on every word and on the end token, so that P(<agent> | <bos> words) reads
whether the words so far make a whole turn. Utterances: the SGD callers' requests and the
assistants' replies (CC BY-SA 4.0), the training split's chat, chatterbot and persona
prompts; trailing punctuation is stripped (Whisper puts a full stop after fragments too; the
endpointer reads punctuation itself).

The end token's log-odds are calibrated into a probability by a logistic fit on utterances
held out of training, each whole and cut after a random word, weighted so whole and cut
texts weigh the same at every length (as `llm.turn_end`'s probe is): its log-odds then
estimate a likelihood ratio, which the endpointer adds to its prior from the words' ending.

    python -m llm.turn_end_lm --minutes 30 --out llm/weights/turn_end_lm   # train, calibrate
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from llm.loader import ModelLoadError
from llm.pair import Pair
from llm.tokenizer import ChatTokenizer
from llm.turn_end import auc, examples, fit_logistic, length_balanced_weights, length_matched, strip_trailing_punct

CALIBRATION_FILE = "turn_end_lm.json"
MAX_TOKENS = 40  # the words read: the turn's last 40 tokens after <bos>
WEIGHTS = Path(__file__).parent / "weights" / "turn_end_lm"


def _held(text: str, share: int = 50) -> bool:
    """1 utterance in ``share``, by a stable hash: held out of training, for calibration."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) % share == 0


def chat_split(seed: int = 1234) -> tuple[list[Pair], list[Pair]]:
    """`llm.train`'s split of the chat corpora: (training pairs, held-out pairs)."""
    from llm.data import all_pairs, split_pairs
    from llm.train import HELDOUT

    return split_pairs(all_pairs(seed), HELDOUT, seed)


def utterances(train: list[Pair], seed: int = 1234, chat: int = 40000, cap: int = 20) -> list[str]:
    """Whole utterances as often as they are said, each at most ``cap`` times: SGD's caller
    and assistant turns, and of ``train`` (the training side of `chat_split`) the chatterbot
    and persona prompts and ``chat`` of the chat prompts. How often a short answer ("Yes",
    "Thank you") is a whole turn is what the end token learns, so repeats are kept, not
    collapsed to one."""
    from llm.data import sgd_pairs

    sgd = sgd_pairs()
    texts = [p.prompt for p in sgd] + [p.response for p in sgd]
    texts += [p.prompt for p in train if p.source != "chitchat"]
    chats = [p.prompt for p in train if p.source == "chitchat"]
    texts += random.Random(seed).sample(chats, min(chat, len(chats)))
    count = Counter(t for t in map(strip_trailing_punct, texts) if t)
    return [t for t, n in sorted(count.items()) for _ in range(min(n, cap))]


@dataclass
class TurnEndLM:
    """P(the words make a whole turn), from the fine-tuned causal LM and its calibration."""

    model: torch.nn.Module
    tok: ChatTokenizer
    scale: float = 1.0
    shift: float = 0.0

    @classmethod
    def load(cls, path: Path = WEIGHTS) -> TurnEndLM:
        """The model in ``path``; `ModelLoadError` naming the path where it is missing or broken."""
        from transformers import GPT2LMHeadModel

        try:
            d = json.loads((path / CALIBRATION_FILE).read_text())
            model = GPT2LMHeadModel.from_pretrained(str(path), local_files_only=True, dtype=torch.float32).eval()
            return cls(model, ChatTokenizer.load(path), float(d["scale"]), float(d["shift"]))
        except Exception as exc:  # transformers, json and OS errors: name the path
            raise ModelLoadError(f"no turn-end LM at {path}: {exc}") from exc

    def _ids(self, text: str) -> list[int]:
        body = self.tok.encode(" " + strip_trailing_punct(text))[-MAX_TOKENS:]
        return [self.tok.special.bos, *body]

    @torch.no_grad()
    def end_logodds(self, texts: list[str]) -> list[float]:
        """log P(end) - log P(not end) after each text's words."""
        rows = [self._ids(t) for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tok.special.pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, r in enumerate(rows):  # left-padded: every row's last word at the last column
            ids[i, width - len(r):] = torch.tensor(r)
            attn[i, width - len(r):] = 1
        pos = (attn.cumsum(1) - 1).clamp_min(0)
        h = self.model.transformer(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
        logp = self.model.lm_head(h[:, -1]).log_softmax(-1)  # the last column only: no (N, T, vocab) logits
        end = logp[:, self.tok.special.sep]
        return (end - torch.log1p(-end.exp().clamp(max=1 - 1e-6))).tolist()

    def logodds(self, texts: list[str], batch: int = 128) -> torch.Tensor:
        """`end_logodds` of any number of texts, ``batch`` at a time."""
        return torch.tensor([v for i in range(0, len(texts), batch) for v in self.end_logodds(texts[i: i + batch])])

    def probs(self, texts: list[str]) -> list[float]:
        return torch.sigmoid(self.scale * self.logodds(texts) + self.shift).tolist()

    def prob(self, text: str) -> float:
        return self.probs([text])[0]


def _batch(tok: ChatTokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    sp = tok.special
    rows = [[sp.bos, *tok.encode(" " + t)[-MAX_TOKENS:], sp.sep] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), sp.pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        labels[i, 1 : len(r)] = torch.tensor(r[1:])
    return ids, attn, labels


def calibrate(lm: TurnEndLM, held: list[str], seed: int) -> dict[str, float]:
    """Fits ``scale`` and ``shift`` on half of ``held`` (whole and cut, length-balanced) and
    scores the other half."""
    fit, check = held[0::2], held[1::2]
    texts, y = examples(fit, random.Random(seed))
    w, b = fit_logistic(lm.logodds(texts).unsqueeze(1), y, length_balanced_weights(texts, y), max_iter=200)
    lm.scale, lm.shift = float(w[0]), b
    c_texts, c_y = examples(check, random.Random(seed + 1))
    m_texts, m_y = length_matched(check, random.Random(seed + 2))
    return {"scale": lm.scale, "shift": lm.shift,
            "heldout_auc": round(auc(lm.probs(c_texts), c_y), 4),
            "heldout_auc_length_matched": round(auc(lm.probs(m_texts), m_y), 4)}


def chat_heldout(lm: TurnEndLM, held: list[Pair], seed: int) -> dict[str, float]:
    """AUCs on `chat_split`'s held-out prompts, with the texts `llm.turn_end`'s probe is scored
    on (its ``heldout_auc`` and ``heldout_auc_length_matched``): the two side by side."""
    prompts = [p.prompt for p in held]
    h_texts, h_y = examples(prompts, random.Random(seed + 1))
    m_texts, m_y = length_matched(prompts, random.Random(seed + 2))
    return {"chat_heldout_auc": round(auc(lm.probs(h_texts), h_y), 4),
            "chat_heldout_auc_length_matched": round(auc(lm.probs(m_texts), m_y), 4)}


def main(argv: list[str] | None = None) -> int:
    from transformers import GPT2LMHeadModel

    from llm.train import lr_at

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", type=Path, default=Path(__file__).parent / "weights" / "ar")
    ap.add_argument("--out", type=Path, default=WEIGHTS)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: when the minutes are up)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    chat_train, chat_held = chat_split(args.seed)
    texts = utterances(chat_train, args.seed)
    held = sorted({t for t in texts if _held(t) and len(t.split()) >= 2})
    train = [t for t in texts if not _held(t)]
    rng = random.Random(args.seed)
    rng.shuffle(train)
    tok = ChatTokenizer.load(args.init)
    model = GPT2LMHeadModel.from_pretrained(str(args.init), local_files_only=True, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    print(f"turn-end LM: {len(train)} training utterances, {len(held)} held out", flush=True)
    budget, step, losses = args.minutes * 60, 0, []
    while time.monotonic() - t0 < budget and not (args.steps and step >= args.steps):
        i = (step * args.batch) % len(train)
        items = train[i: i + args.batch]
        for g in opt.param_groups:
            g["lr"] = lr_at((time.monotonic() - t0) / budget, step, args.lr, 100)
        ids, attn, labels = _batch(tok, items)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 100 == 0:
            print(f"step {step} loss {sum(losses[-100:]) / 100:.3f} {time.monotonic() - t0:.0f} s", flush=True)
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    half = type(model)(model.config)
    half.load_state_dict(model.state_dict())
    half.half().save_pretrained(str(args.out))
    tok.save(args.out)
    lm = TurnEndLM(model, tok)
    cal = {**calibrate(lm, held, args.seed), **chat_heldout(lm, chat_held, args.seed)}
    root = Path(__file__).resolve().parents[1]
    init = args.init.resolve()
    shown = str(init.relative_to(root)) if init.is_relative_to(root) else str(init)
    meta = {**cal, "init": shown, "steps": step, "minutes": round((time.monotonic() - t0) / 60, 2),
            "batch": args.batch, "lr": args.lr, "threads": args.threads, "seed": args.seed,
            "train_utterances": len(train), "heldout_utterances": len(held),
            "loss_curve": [round(sum(losses[j: j + 100]) / len(losses[j: j + 100]), 4)
                           for j in range(0, len(losses), 100)]}
    (args.out / CALIBRATION_FILE).write_text(json.dumps(meta, indent=1))
    print(f"turn-end LM: {step} steps, held-out AUC {cal['heldout_auc']} (whole vs cut at a random word), "
          f"{cal['heldout_auc_length_matched']} (length-matched); on the chat split the probe is scored on "
          f"{cal['chat_heldout_auc']} / {cal['chat_heldout_auc_length_matched']}; wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

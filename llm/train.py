"""Train the embedded models on CPU with a fixed seed and a wall-clock budget.

    python -m llm.train --arch mdlm --minutes 60 --out llm/weights/mdlm
    python -m llm.train --arch ar   --minutes 60 --out llm/weights/ar --tokenizer llm/weights/mdlm
    python -m llm.train --arch bdlm --minutes 60 --out llm/weights/bdlm --tokenizer llm/weights/ar \
        --init llm/weights/ar --sgd

BDLM objective (block diffusion adapted from the AR baseline): see `llm.block_lm`.

MDLM objective: only the reply block is masked, at rate t ~ U(0, 1), and the loss on masked
positions is weighted by 1/t. Collapse to end/pad predictions (measured here on a short run)
is prevented by a length-aware loss: the reply and its end-of-turn token carry full weight,
while the padding after the end token carries ``--pad-weight`` (0.1), so the model still
learns where a reply ends but padding cannot dominate the gradient.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from llm import block_lm
from llm.architectures import new_ar, new_mdlm
from llm.data import (
    DISTILLED_REPLIES,
    Pair,
    all_pairs,
    distilled_replies,
    grammatical_replies,
    reply_key,
    sgd_pairs,
    split_pairs,
)
from llm.persona import persona_pairs
from llm.persona_service import service_pairs
from llm.quality import repeats
from llm.tokenizer import ChatTokenizer, train_tokenizer

PROMPT_LEN = 32
BLOCK_LEN = 32
HELDOUT = 300


@dataclass
class Encoded:
    prompt: list[int]  # <bos> ... <agent>
    reply: list[int]  # reply tokens + <eot>


def encode_pairs(tok: ChatTokenizer, pairs: list[Pair]) -> list[Encoded]:
    out = []
    for p in pairs:
        reply = tok.encode(" " + p.response) + [tok.special.eot]
        if len(reply) > BLOCK_LEN:
            continue  # a phone reply that does not fit one block is not what we want to learn
        out.append(Encoded(tok.prompt_ids(p.prompt, PROMPT_LEN), reply))
    return out


def mdlm_batch(
    tok: ChatTokenizer, items: list[Encoded], gen: torch.Generator, pad_weight: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    sp = tok.special
    n = len(items)
    ids = torch.full((n, PROMPT_LEN + BLOCK_LEN), sp.pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    weight = torch.zeros((n, BLOCK_LEN))
    for i, it in enumerate(items):
        p = it.prompt
        ids[i, PROMPT_LEN - len(p) : PROMPT_LEN] = torch.tensor(p)
        attn[i, PROMPT_LEN - len(p) :] = 1
        ids[i, PROMPT_LEN : PROMPT_LEN + len(it.reply)] = torch.tensor(it.reply)
        weight[i, : len(it.reply)] = 1.0
        weight[i, len(it.reply) :] = pad_weight
    # stratified t in (0, 1]: lower variance than i.i.d. draws
    u = torch.rand(1, generator=gen).item()
    t = ((u + torch.arange(n) / n) % 1.0).clamp_min(1e-3)
    masked = torch.rand((n, BLOCK_LEN), generator=gen) < t[:, None]
    targets = ids[:, PROMPT_LEN:].clone()
    inputs = ids.clone()
    inputs[:, PROMPT_LEN:][masked] = sp.mask
    return inputs, attn, targets, masked, weight / t[:, None]


def mdlm_loss(model: torch.nn.Module, batch: tuple, n_reply_tokens: float) -> torch.Tensor:
    inputs, attn, targets, masked, weight = batch
    hidden = model.model(input_ids=inputs, attention_mask=attn).last_hidden_state[:, PROMPT_LEN:]
    # the vocabulary head runs on masked positions only: a quarter of the compute is saved
    logits = model.decoder(model.head(hidden[masked]))
    ce = F.cross_entropy(logits, targets[masked], reduction="none")
    return (ce * weight[masked]).sum() / n_reply_tokens


def ar_batch(tok: ChatTokenizer, items: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    sp = tok.special
    n = len(items)
    seq = max(len(it.prompt) + len(it.reply) for it in items)
    ids = torch.full((n, seq), sp.pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, it in enumerate(items):
        row = it.prompt + it.reply
        ids[i, : len(row)] = torch.tensor(row)
        attn[i, : len(row)] = 1
        labels[i, len(it.prompt) : len(row)] = torch.tensor(it.reply)
    return ids, attn, labels


def lr_at(frac: float, step: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def save(model: torch.nn.Module, tok: ChatTokenizer, out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    half = type(model)(model.config)
    half.load_state_dict(model.state_dict())
    half = half.half()
    half.save_pretrained(out, safe_serialization=True)
    tok.save(out)
    (out / "train_meta.json").write_text(json.dumps(meta, indent=2))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["mdlm", "ar", "bdlm"], required=True)
    ap.add_argument("--minutes", type=float, default=60.0, help="wall-clock training budget")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, help="reuse this tokenizer (so both models share it)")
    ap.add_argument("--vocab", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--pad-weight", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--order-seed", type=int,
                    help="seed of the data order only (default --seed); a continued run sets a new one so it does not "
                         "replay the batches of the run it continues, while the held-out split stays fixed")
    ap.add_argument("--extra-persona", type=int, default=0, help="extra copies of the generated call persona slice")
    ap.add_argument("--service", type=int, default=0,
                    help="pairs per group of the generated customer-service slice (llm.persona_service), added after "
                         "the filters: its replies all parse (tests/test_persona_service.py)")
    ap.add_argument("--sgd", action="store_true", help="add the Schema-Guided Dialogue pairs (llm/corpus) to training")
    ap.add_argument("--sgd-context-free", action="store_true",
                    help="with --sgd: only the pairs that open or close a dialogue, whose replies need no earlier "
                         "turn (the reply model sees no history)")
    ap.add_argument("--grammatical", action="store_true",
                    help="train only on replies that parse under link-grammar and do not stutter "
                         "(llm/corpus/grammatical_replies.txt.gz, made by scripts/filter_replies.py)")
    ap.add_argument("--distill", action="store_true",
                    help="bdlm: train on the reply model's own filtered replies, one per prompt "
                         "(llm/corpus/distilled_replies.jsonl.gz, made by scripts/distill_replies.py)")
    ap.add_argument("--distill-file", type=Path, default=DISTILLED_REPLIES,
                    help="with --distill: the targets (scripts/distill_replies.py --out; "
                         "llm/corpus/ar_distilled_replies.jsonl.gz holds the AR baseline's)")
    ap.add_argument("--distill-cap", type=int, default=0,
                    help="with --distill: at most this many prompts per distinct reply (0: all), so the most "
                         "common replies do not crowd out the rest")
    ap.add_argument("--chitchat-keep", type=int, default=0,
                    help="keep at most this many chitchat-dataset pairs (0: all), drawn by the order seed: the "
                         "students' small talk outnumbers the assistant-style replies about 3 to 1")
    ap.add_argument("--blocks", default="8,16", help="bdlm: block sizes, one drawn per batch")
    ap.add_argument("--ar-weight", type=float, default=0.5, help="bdlm: weight of the clean copy's AR loss")
    ap.add_argument("--max-steps", type=int, help="stop after this many optimizer steps (to match another run)")
    ap.add_argument("--init", type=Path, help="continue from the weights in this directory")
    ap.add_argument("--checkpoint-minutes", type=float, default=10.0)
    ap.add_argument("--bf16", action="store_true",
                    help="bfloat16 autocast for the forward pass (weights and optimizer stay float32); on this "
                         "project's AMX CPU 0.84 s per MDLM step instead of 1.19 (one 30-step measurement)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed if args.order_seed is None else args.order_seed)
    gen = torch.Generator().manual_seed(args.seed)

    pairs = all_pairs(args.seed)
    train_pairs, held = split_pairs(pairs, HELDOUT, args.seed)
    if args.extra_persona:
        # more of the phone-call slice, added after the split so the held-out set never moves
        held_prompts = {p.prompt for p in held}
        extra = persona_pairs(args.seed + 1, copies=args.extra_persona)
        train_pairs += [p for p in extra if p.prompt not in held_prompts]
    if args.sgd:
        train_pairs += sgd_pairs(context_free=args.sgd_context_free)
    if args.arch == "bdlm":
        train_pairs = [p for p in train_pairs if not repeats(p.response)]
    if args.grammatical:
        keep = grammatical_replies()
        train_pairs = [p for p in train_pairs if reply_key(p.response) in keep]
    if args.distill:
        target = distilled_replies(args.distill_file)
        by_prompt = {p.prompt: p for p in train_pairs if reply_key(p.prompt) in target}
        train_pairs = [Pair(p.prompt, target[reply_key(p.prompt)], p.source) for p in by_prompt.values()]
        if args.distill_cap:
            rng.shuffle(train_pairs)
            seen: dict[str, int] = {}
            capped = []
            for p in train_pairs:
                seen[p.response] = seen.get(p.response, 0) + 1
                if seen[p.response] <= args.distill_cap:
                    capped.append(p)
            train_pairs = capped
    if args.chitchat_keep:
        chat = [p for p in train_pairs if p.source == "chitchat"]
        rng.shuffle(chat)
        kept = {id(p) for p in chat[: args.chitchat_keep]}
        train_pairs = [p for p in train_pairs if p.source != "chitchat" or id(p) in kept]
    if args.service:
        train_pairs += service_pairs(args.seed + 2, per_group=args.service)
    if args.tokenizer:
        tok = ChatTokenizer.load(args.tokenizer)
    else:
        texts = [p.prompt for p in train_pairs] + [p.response for p in train_pairs]
        tok = train_tokenizer(texts, args.vocab)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(args.out)
    data = encode_pairs(tok, train_pairs)
    model = new_mdlm(tok) if args.arch == "mdlm" else new_ar(tok)
    blocks = [int(b) for b in args.blocks.split(",")]
    if args.arch == "bdlm":
        if any(block_lm.REPLY_LEN % b for b in blocks):
            raise SystemExit(f"--blocks must divide {block_lm.REPLY_LEN}")
        model.config.block_diffusion = {"blocks": blocks, "reply_len": block_lm.REPLY_LEN}
    if args.init:
        from safetensors.torch import load_file

        state = load_file(str(args.init / "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        model.tie_weights()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.arch}: {n_params / 1e6:.2f}M params, {len(data)} training pairs, vocab {tok.vocab_size}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)

    budget = args.minutes * 60.0
    start = time.monotonic()
    last_ckpt = start
    step, epoch, losses = 0, 0, []
    order: list[int] = []
    model.train()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= budget or (args.max_steps is not None and step >= args.max_steps):
            break
        if len(order) < args.batch:
            order = list(range(len(data)))
            rng.shuffle(order)
            epoch += 1
        items = [data[order.pop()] for _ in range(args.batch)]
        for g in opt.param_groups:
            frac = max(elapsed / budget, step / args.max_steps if args.max_steps else 0.0)
            g["lr"] = lr_at(frac, step, args.lr, warmup=200)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            if args.arch == "mdlm":
                batch = mdlm_batch(tok, items, gen, args.pad_weight)
                loss = mdlm_loss(model, batch, float(sum(len(it.reply) for it in items)))
            elif args.arch == "bdlm":
                sp = tok.special
                bb = block_lm.make_batch(
                    [block_lm.Example(it.prompt, it.reply) for it in items], rng.choice(blocks),
                    sp.mask, sp.pad, sp.eot, gen)
                loss = block_lm.loss(model, bb, args.ar_weight)
            else:
                ids, attn, labels = ar_batch(tok, items)
                loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
        if step % 100 == 0:
            print(f"step {step} epoch {epoch} {elapsed / 60:.1f} min loss {sum(losses[-100:]) / 100:.3f}", flush=True)
        meta = {
            "arch": args.arch, "params": n_params, "steps": step, "epochs_started": epoch,
            "minutes": round((time.monotonic() - start) / 60, 2), "batch": args.batch, "lr": args.lr,
            "pad_weight": args.pad_weight, "seed": args.seed, "order_seed": args.order_seed, "threads": args.threads,
            "bf16_autocast": args.bf16,
            "train_pairs": len(data), "extra_persona": args.extra_persona,
            "service_per_group": args.service, "init": str(args.init or ""),
            "chitchat_keep": args.chitchat_keep,
            "grammatical_only": args.grammatical, "distill_cap": args.distill_cap,
            "distilled": str(args.distill_file) if args.distill else False,
            "sgd_context_free": args.sgd_context_free,
            "heldout": HELDOUT, "prompt_len": PROMPT_LEN, "block_len": BLOCK_LEN,
            "loss_curve": [round(sum(c) / len(c), 4) for c in (losses[i : i + 100] for i in range(0, step, 100))],
            "data": ["chitchat-dataset 0.9.0 (MIT)", "chatterbot-corpus 1.3.3 (BSD)", "llm.persona (generated)"]
            + (["llm.persona_service (generated)"] if args.service else [])
            + (["Schema-Guided Dialogue (CC BY-SA 4.0), llm/corpus/sgd_pairs.jsonl.gz"] if args.sgd else []),
            **({"blocks": blocks, "ar_weight": args.ar_weight} if args.arch == "bdlm" else {}),
        }
        if time.monotonic() - last_ckpt > args.checkpoint_minutes * 60:
            save(model, tok, args.out, meta)
            last_ckpt = time.monotonic()
    save(model, tok, args.out, meta)
    print(f"saved {args.out} after {step} steps", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()

"""Block decoding for masked diffusion LMs: confidence-based parallel unmasking.

One entry point, `generate_block` (and `generate_blocks` for a batch of calls). A block of
``block_len`` mask tokens after the prompt is filled in a few denoising passes:

- each pass scores every masked position (``score``: max_prob, margin or entropy) and commits
  the best ones;
- how many per pass follows Mercury-style coarse-to-fine scheduling: after pass s of S the
  committed fraction is ((s+1)/S)**(1/gamma), so gamma > 1 commits more tokens early;
- with ``tau`` set, Fast-dLLM's threshold rule applies on top: the best position plus every
  position whose probability is at least tau are committed; when every remaining position
  passes tau the block finishes early (adaptive stop, after ``min_steps``);
- semi-autoregressive sub-blocks (LLaDA): positions are only committed inside the first
  sub-block that still has masks;
- the end-of-turn token ends the block early and is ranked low (``eot_penalty``) so that a
  weak model cannot collapse to an empty reply; positions after it become padding;
- a wall-clock ``deadline`` makes it an anytime decoder: when the next pass would overrun,
  one final pass fills every remaining mask by argmax;
- warm start: ``init_block`` plus ``remask`` keeps the unmasked tokens of a previous block
  and re-decodes only the re-masked positions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

Score = Literal["max_prob", "margin", "entropy"]
# logits_fn(input_ids [B, T], attention_mask [B, T], block_start) -> logits [B, block_len, V]
LogitsFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class SpecialTokens:
    mask: int
    eot: int
    pad: int
    forbidden: tuple[int, ...] = ()  # never generated (bos, separators, mask itself)


@dataclass
class DecodeOptions:
    block_len: int = 32
    steps: int = 8
    min_steps: int = 1
    tau: float | None = 0.9
    score: Score = "max_prob"
    gamma: float = 1.0
    sub_block: int = 32
    eot_penalty: float = 0.5
    min_len: int = 1  # the reply has at least this many tokens before an end token
    deadline: float | None = None  # absolute time.perf_counter() value

    def __post_init__(self) -> None:
        if self.block_len < 1 or self.steps < 1 or self.sub_block < 1:
            raise ValueError("block_len, steps and sub_block must be positive")
        if self.min_steps > self.steps:
            raise ValueError("min_steps must not exceed steps")
        if self.tau is not None and not 0.0 < self.tau <= 1.0:
            raise ValueError("tau must be in (0, 1]")
        if self.gamma <= 0:
            raise ValueError("gamma must be positive")


@dataclass
class DecodeStats:
    steps: int = 0
    tokens_per_step: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    deadline_hit: bool = False
    total_s: float = 0.0

    @property
    def mean_step_s(self) -> float:
        return sum(self.step_times) / len(self.step_times) if self.step_times else 0.0


@dataclass
class BlockResult:
    ids: list[int]  # the reply, trimmed before the end-of-turn token
    block: list[int]  # the whole decoded block (for warm starts)
    confidence: list[float]  # per block position, probability when committed
    ended: bool  # an end-of-turn token was generated inside the block
    stats: DecodeStats


def schedule_counts(masked: int, steps: int, gamma: float) -> list[int]:
    """Tokens to commit at each of ``steps`` passes for ``masked`` positions (sums to masked)."""
    if masked <= 0:
        return [0] * steps
    steps = max(1, min(steps, masked))
    cum = [round(masked * ((s + 1) / steps) ** (1.0 / gamma)) for s in range(steps)]
    cum[-1] = masked
    out, prev = [], 0
    for c in cum:
        c = max(c, prev + 1) if prev < masked else prev
        c = min(c, masked)
        out.append(c - prev)
        prev = c
    return out


def _scores(probs: torch.Tensor, kind: Score) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (token, confidence=max prob, ranking score) per position."""
    top2 = probs.topk(2, dim=-1)
    tok = top2.indices[..., 0]
    conf = top2.values[..., 0]
    if kind == "max_prob":
        rank = conf
    elif kind == "margin":
        rank = top2.values[..., 0] - top2.values[..., 1]
    else:
        ent = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
        rank = -ent
    return tok, conf, rank


def generate_blocks(
    logits_fn: LogitsFn,
    prompts: list[list[int]],
    special: SpecialTokens,
    opts: DecodeOptions,
    pad_id: int | None = None,
    init_blocks: list[list[int]] | None = None,
    remask: list[list[bool]] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[BlockResult]:
    """Decode one block for each prompt in one batch. Rows finish independently."""
    t_start = time.perf_counter()
    B, L = len(prompts), opts.block_len
    if B == 0:
        return []
    pad = special.pad if pad_id is None else pad_id
    P = max(len(p) for p in prompts)
    ids = torch.full((B, P + L), pad, dtype=torch.long)
    attn = torch.zeros((B, P + L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) :] = 1
    block = ids[:, P:]  # a view: writes go into ids
    block.fill_(special.mask)
    conf = torch.zeros((B, L))
    if init_blocks is not None:
        for i, init in enumerate(init_blocks):
            keep = [not m for m in (remask[i] if remask else [False] * L)]
            for j in range(L):
                if keep[j] and init[j] != special.mask:
                    block[i, j] = init[j]
                    conf[i, j] = 1.0
    # a warm block that already contains an end token keeps only what precedes it
    done = torch.zeros(B, dtype=torch.bool)
    ended = torch.zeros(B, dtype=torch.bool)
    for i in range(B):
        _close_after_eot(block[i], special)
        if (block[i] == special.eot).any():
            ended[i] = True
        if not (block[i] == special.mask).any():
            done[i] = True

    stats = [DecodeStats() for _ in range(B)]
    n_sub = math.ceil(L / opts.sub_block)
    steps_per_sub = max(1, opts.steps // n_sub)
    sub_steps_used = [[0] * n_sub for _ in range(B)]
    step = 0
    est_step = 0.0
    forbidden = list(special.forbidden) + [special.mask]
    while not bool(done.all()):
        now = time.perf_counter()
        final = step >= opts.steps + n_sub  # safety net: never loop forever
        if opts.deadline is not None and now + est_step >= opts.deadline and step > 0:
            final = True
        if opts.deadline is not None and now >= opts.deadline:
            final = True
        if should_stop is not None and should_stop():
            raise DecodeCancelled()
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = logits_fn(ids, attn, P).float()
        logits[..., forbidden] = -float("inf")
        probs = logits.softmax(-1)
        if opts.min_len > 0:
            end_ids = [special.eot, special.pad]
            head = probs[:, : opts.min_len]
            head[..., end_ids] = 0.0
            probs[:, : opts.min_len] = head / head.sum(-1, keepdim=True).clamp_min(1e-12)
        tok, cmax, rank = _scores(probs, opts.score)
        # padding predicted before any end token means "the reply ends here"
        tok = torch.where(tok == special.pad, torch.full_like(tok, special.eot), tok)
        is_end = tok == special.eot
        rank = torch.where(is_end, rank - (1.0 - opts.eot_penalty) * rank.abs() - (1.0 - opts.eot_penalty), rank)
        dt = time.perf_counter() - t0
        est_step = dt if est_step == 0 else 0.5 * est_step + 0.5 * dt
        for i in range(B):
            if done[i]:
                continue
            masked = block[i] == special.mask
            if final:
                sel = masked.nonzero().flatten().tolist()
                stats[i].deadline_hit = opts.deadline is not None and step < opts.steps
            else:
                sb = int(masked.nonzero()[0]) // opts.sub_block
                lo, hi = sb * opts.sub_block, min(L, (sb + 1) * opts.sub_block)
                cand = [j for j in range(lo, hi) if masked[j]]
                used = sub_steps_used[i][sb]
                left = max(1, steps_per_sub - used)
                sched = schedule_counts(len(cand), left, opts.gamma)[0]
                if opts.tau is None:
                    k, over_tau = sched, []
                else:
                    # the best position, every position over tau, and enough to finish in budget
                    k = max(1, math.ceil(len(cand) / left))
                    over_tau = [j for j in cand if float(cmax[i, j]) >= opts.tau]
                if step + 1 < opts.min_steps:
                    # adaptive stop may not end the block before min_steps passes
                    cap = max(1, len(cand) - (opts.min_steps - step - 1))
                    k, over_tau = min(k, cap), over_tau[: max(0, cap - k)]
                order = sorted(cand, key=lambda j: float(rank[i, j]), reverse=True)
                sel = sorted(set(order[:k]) | set(over_tau))
                sub_steps_used[i][sb] += 1
            for j in sel:
                block[i, j] = tok[i, j]
                conf[i, j] = float(cmax[i, j])
            stats[i].steps += 1
            stats[i].tokens_per_step.append(len(sel))
            stats[i].step_times.append(dt)
            if _close_after_eot(block[i], special):
                ended[i] = True
            if final or not (block[i] == special.mask).any():
                done[i] = True
        step += 1
    total = time.perf_counter() - t_start
    results = []
    for i in range(B):
        row = block[i].tolist()
        reply = []
        for t in row:
            if t in (special.eot, special.pad):
                break
            reply.append(t)
        stats[i].total_s = total
        results.append(BlockResult(reply, row, conf[i].tolist(), bool(ended[i]), stats[i]))
    return results


def _close_after_eot(row: torch.Tensor, special: SpecialTokens) -> bool:
    """Once an end token is committed, everything after it is padding. Returns True if ended."""
    ends = (row == special.eot).nonzero()
    if len(ends) == 0:
        return False
    j = int(ends[0])
    row[j + 1 :] = special.pad
    return True


def generate_block(
    logits_fn: LogitsFn,
    prompt_ids: list[int],
    special: SpecialTokens,
    opts: DecodeOptions,
    init_block: list[int] | None = None,
    remask: list[bool] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> BlockResult:
    return generate_blocks(
        logits_fn,
        [prompt_ids],
        special,
        opts,
        init_blocks=[init_block] if init_block is not None else None,
        remask=[remask] if remask is not None else None,
        should_stop=should_stop,
    )[0]


class DecodeCancelled(Exception):
    """Raised inside the worker thread when the caller cancelled the generation."""

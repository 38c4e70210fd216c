"""Block decoding for masked diffusion LMs: confidence-based parallel unmasking.

One entry point, `generate_block` (and `generate_blocks` for a batch of calls). A block of
``block_len`` mask tokens after the prompt is filled in a few denoising passes:

- each pass scores every masked position (``score``: max_prob, margin or entropy) and commits
  the best ones;
- how many per pass follows Mercury-style coarse-to-fine scheduling: after pass u of the U
  passes a sub-block gets, the committed fraction is ((u+1)/U)**(1/gamma), so gamma > 1
  commits more tokens early;
- with ``tau`` set, Fast-dLLM's threshold rule applies on top: the scheduled best positions
  plus every position whose confidence is at least tau are committed; when every remaining
  position passes tau the block finishes early (adaptive stop, after ``min_steps``);
- semi-autoregressive sub-blocks (LLaDA): positions are only committed inside the first
  sub-block that still has masks; the pass budget is shared among the sub-blocks that still
  hold masks, so a reply that ends in the first sub-block gets every pass;
- end of turn: the end token and padding are one outcome ("the reply is over here") whose
  probability is their sum. With ``end_rule="rank"`` (default) an end competes with words
  for a position but is ranked down by ``eot_penalty``, so the words around it settle first
  and a weak model cannot collapse to an empty reply. With ``end_rule="length"`` the first
  position whose end probability reaches ``end_threshold`` becomes the end token as soon as
  it does, fixing the reply length the way Mask-Predict fixes a target length, and the
  positions before it are words. Either way the block closes at its first end token and
  the rest is padding; the benchmark's ``--ablation`` compares the two;
- ``no_adjacent_repeat``: a position never takes the token committed next to it. Parallel
  decoding picks tokens from per-position marginals, and a weak model's marginals agree on
  frequent tokens, so neighbours decoded independently repeat ("....."); in the training
  replies only 0.14 % of adjacent token pairs are identical;
- a wall-clock ``deadline`` makes it an anytime decoder: when the time left after a pass
  would not cover another pass, every remaining mask is filled from that pass's logits
  (argmax), so the call returns by the deadline with no masks left;
- ``trim_tail`` (default): once a row has its end token, the padding after it is left out of
  the passes (cut off when every row in the batch has ended, masked out of attention
  before). The model saw that padding in training, but the benchmark's ablation measured the
  same replies' quality with and without it, and shorter passes;
- warm start: ``init_block`` plus ``remask`` keeps the unmasked tokens of a previous block
  and re-decodes only the re-masked positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

Score = Literal["max_prob", "margin", "entropy"]
EndRule = Literal["length", "rank"]
# logits_fn(input_ids [B, T], attention_mask [B, T], block_start) -> logits [B, T - block_start, V]
LogitsFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class SpecialTokens:
    mask: int
    eot: int
    pad: int
    forbidden: tuple[int, ...] = ()  # never generated (bos, separators, mask itself)
    ends: tuple[int, ...] = ()  # other tokens that also end the turn (e.g. <|im_end|>, <|eot_id|>)

    @property
    def end_ids(self) -> list[int]:
        return list(dict.fromkeys((self.eot, self.pad, *self.ends)))


@dataclass
class DecodeOptions:
    block_len: int = 32
    steps: int = 8  # the most denoising passes a block gets
    min_steps: int = 1
    tau: float | None = 0.9
    score: Score = "max_prob"
    gamma: float = 1.0
    sub_block: int = 32
    eot_penalty: float = 0.5  # end_rule="rank" only
    min_len: int = 1  # the reply has at least this many tokens before an end token
    deadline: float | None = None  # absolute time.perf_counter() value
    end_rule: EndRule = "rank"
    end_threshold: float = 0.5  # end_rule="length": end probability that fixes the length
    no_adjacent_repeat: bool = True
    trim_tail: bool = True  # once the end is fixed, leave the padding after it out of the passes

    def __post_init__(self) -> None:
        if self.block_len < 1 or self.steps < 1 or self.sub_block < 1:
            raise ValueError("block_len, steps and sub_block must be positive")
        if not 1 <= self.min_steps <= self.steps:
            raise ValueError("min_steps must be between 1 and steps")
        if self.tau is not None and not 0.0 < self.tau <= 1.0:
            raise ValueError("tau must be in (0, 1]")
        if self.gamma <= 0:
            raise ValueError("gamma must be positive")
        if self.score not in ("max_prob", "margin", "entropy"):
            raise ValueError(f"unknown score {self.score!r}")
        if self.end_rule not in ("length", "rank"):
            raise ValueError(f"unknown end_rule {self.end_rule!r}")
        if not 0.0 <= self.eot_penalty <= 1.0 or not 0.0 < self.end_threshold <= 1.0:
            raise ValueError("eot_penalty must be in [0, 1] and end_threshold in (0, 1]")
        if self.min_len < 0 or self.min_len > self.block_len:
            raise ValueError("min_len must be between 0 and block_len")


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


class DecodeCancelled(Exception):
    """Raised inside the worker thread when the caller cancelled the generation."""


def schedule_counts(masked: int, steps: int, gamma: float) -> list[int]:
    """Tokens to commit at each of ``steps`` passes for ``masked`` positions (sums to masked).

    Cumulative share after pass s is ((s+1)/steps)**(1/gamma); every pass commits at least one
    token while any is left, and there are never more passes than tokens."""
    if masked <= 0:
        return [0] * max(1, steps)
    steps = max(1, min(steps, masked))
    cum = [round(masked * ((s + 1) / steps) ** (1.0 / gamma)) for s in range(steps)]
    cum[-1] = masked
    out, prev = [], 0
    for s, c in enumerate(cum):
        # at least one per pass, and leave at least one for each later pass
        c = min(max(c, prev + 1), masked - (steps - 1 - s))
        out.append(c - prev)
        prev = c
    return out


@dataclass
class _Pass:
    """One denoising pass's proposals for the active rows, as Python lists (fast to index)."""

    tok: list[list[int]]  # best token per position (the end token where the reply ends)
    conf: list[list[float]]  # its probability (for an end: end + pad probability)
    rank: list[list[float]]  # ranking score
    p_end: list[list[float]]
    alt: list[list[list[int]]]  # the best word tokens, for repeat-free final fills
    alt_p: list[list[list[float]]]


def _propose(
    logits: torch.Tensor, block: torch.Tensor, end_at: list[int | None], special: SpecialTokens, opts: DecodeOptions
) -> _Pass:
    probs = logits.float().softmax(-1)
    forbidden = [special.mask, *special.forbidden]
    probs[..., forbidden] = 0.0
    end_ids = special.end_ids
    p_end = probs[..., end_ids].sum(-1)
    words = probs.clone()
    words[..., end_ids] = 0.0
    if opts.no_adjacent_repeat:
        # a word committed next to a position is not a candidate there
        nb = torch.full((*block.shape, 2), special.mask, dtype=torch.long)
        nb[:, 1:, 0] = block[:, :-1]
        nb[:, :-1, 1] = block[:, 1:]
        nb = torch.where(torch.isin(nb, torch.tensor(end_ids)), special.mask, nb)
        words.scatter_(-1, nb, 0.0)
    top = words.topk(3, dim=-1)
    w_p, w_tok = top.values[..., 0], top.indices[..., 0]
    L = block.shape[1]
    pos = torch.arange(L)[None, :]
    can_end = (pos >= opts.min_len).expand(block.shape[0], L)
    if opts.end_rule == "length":
        # once the length is fixed, the positions before the end token are words
        first = torch.tensor([L if e is None else e for e in end_at])[:, None]
        can_end = can_end & ((pos >= first) | (first == L))
    is_end = (p_end > w_p) & can_end
    tok = torch.where(is_end, torch.full_like(w_tok, special.eot), w_tok)
    conf = torch.where(is_end, p_end, w_p)
    if opts.score == "max_prob":
        rank = conf
    else:
        # the distribution over outcomes: every word, plus "end" as one outcome
        q = torch.cat([words, (p_end * can_end)[..., None]], dim=-1)
        q = q / q.sum(-1, keepdim=True).clamp_min(1e-12)
        if opts.score == "margin":
            t2 = q.topk(2, dim=-1).values
            rank = t2[..., 0] - t2[..., 1]
        else:
            rank = (q * q.clamp_min(1e-12).log()).sum(-1)  # negative entropy
    if opts.end_rule == "rank":
        pen = 1.0 - opts.eot_penalty
        rank = torch.where(is_end, rank - pen * rank.abs() - pen, rank)
    return _Pass(tok.tolist(), conf.tolist(), rank.tolist(), p_end.tolist(), top.indices.tolist(), top.values.tolist())


@dataclass
class _Row:
    """Decoding state of one call in the batch."""

    # plan of the sub-block being decoded: its index, how many sub-blocks shared the passes
    # then, its commit schedule, and the passes used and tokens committed since
    sub: int = -1
    sub_share: int = 0
    sched: list[int] = field(default_factory=list)
    used: int = 0
    committed: int = 0
    end_at: int | None = None
    done: bool = False
    stats: DecodeStats = field(default_factory=DecodeStats)


def _pick(
    row: list[int], st: _Row, pp: _Pass, i: int, step: int, special: SpecialTokens, opts: DecodeOptions
) -> list[tuple[int, int, float]]:
    """The (position, token, confidence) commits of one row in a normal pass."""
    L = len(row)
    masked = [j for j in range(L) if row[j] == special.mask]
    commits: dict[int, tuple[int, float]] = {}
    if opts.end_rule == "length" and st.end_at is None:
        for j in masked:
            if j >= opts.min_len and pp.p_end[i][j] >= opts.end_threshold:
                commits[j] = (special.eot, pp.p_end[i][j])
                st.end_at = j
                break
    limit = st.end_at if st.end_at is not None else L
    live = [j for j in masked if j < limit]
    if not live:
        return [(j, t, c) for j, (t, c) in commits.items()]
    sb = live[0] // opts.sub_block
    lo, hi = sb * opts.sub_block, min(limit, (sb + 1) * opts.sub_block)
    cand = [j for j in live if lo <= j < hi]
    subs_left = len({j // opts.sub_block for j in live})
    if sb != st.sub or subs_left < st.sub_share:
        # the passes left are shared by the sub-blocks that still hold masks; plan again when
        # an end token removes later sub-blocks, so a short reply gets every pass
        passes = max(1, (opts.steps - step) // subs_left)
        st.sub, st.sub_share, st.used, st.committed = sb, subs_left, 0, 0
        st.sched = schedule_counts(len(cand), passes, opts.gamma)
    target = sum(st.sched[: st.used + 1]) if st.used < len(st.sched) else st.committed + len(cand)
    k = max(1, target - st.committed)
    # adaptive stop may not finish the block before min_steps passes
    cap = max(1, len(live) - (opts.min_steps - step - 1)) if opts.min_steps > step + 1 else len(live)
    tok, conf, rank = pp.tok[i], pp.conf[i], pp.rank[i]
    order = sorted(cand, key=lambda j: rank[j], reverse=True)
    chosen: dict[int, int] = {}
    for j in order:
        if len(chosen) >= cap:
            break
        t = tok[j]
        over = opts.tau is not None and conf[j] >= opts.tau
        if len(chosen) >= k and not over:
            continue
        if opts.no_adjacent_repeat and t not in (special.eot, special.pad) and t in (
            chosen.get(j - 1), chosen.get(j + 1)
        ):
            continue  # decided together with an identical neighbour: wait a pass
        chosen[j] = t
    st.used += 1
    st.committed += len(chosen)
    for j, t in chosen.items():
        commits[j] = (t, conf[j])
    return [(j, t, c) for j, (t, c) in commits.items()]


def _fill_all(
    row: list[int], pp: _Pass, i: int, special: SpecialTokens, opts: DecodeOptions, st: _Row
) -> list[tuple[int, int, float]]:
    """Final pass: every mask gets a token from this pass's logits, left to right."""
    out: list[tuple[int, int, float]] = []
    cur = list(row)
    limit = st.end_at if st.end_at is not None else len(row)
    for j in range(len(row)):
        if cur[j] != special.mask:
            continue
        if j >= limit:
            break
        t, c = pp.tok[i][j], pp.conf[i][j]
        if opts.no_adjacent_repeat and t != special.eot:
            left = cur[j - 1] if j > 0 else None
            right = cur[j + 1] if j + 1 < len(cur) else None
            for a, p in zip(pp.alt[i][j], pp.alt_p[i][j], strict=True):
                if a not in (left, right):
                    t, c = a, p
                    break
        cur[j] = t
        out.append((j, t, c))
        if t == special.eot:
            break
    return out


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
    """Decode one block for each prompt in one batch. Rows finish independently, and only
    unfinished rows go through the model."""
    t_start = time.perf_counter()
    B, L = len(prompts), opts.block_len
    if B == 0:
        return []
    if any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if init_blocks is not None and (len(init_blocks) != B or any(len(b) != L for b in init_blocks)):
        raise ValueError(f"init_blocks needs one block of {L} tokens per prompt")
    if remask is not None and (len(remask) != B or any(len(r) != L for r in remask)):
        raise ValueError(f"remask needs one list of {L} flags per prompt")
    pad = special.pad if pad_id is None else pad_id
    P = max(len(p) for p in prompts)
    ids = torch.full((B, P + L), pad, dtype=torch.long)
    attn = torch.zeros((B, P + L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) :] = 1
    rows = [[special.mask] * L for _ in range(B)]
    conf = [[0.0] * L for _ in range(B)]
    states = [_Row() for _ in range(B)]
    if init_blocks is not None:
        for i, init in enumerate(init_blocks):
            for j in range(L):
                if not (remask and remask[i][j]) and init[j] != special.mask:
                    rows[i][j], conf[i][j] = init[j], 1.0
            _close_after_end(rows[i], special)
            if special.eot in rows[i]:
                states[i].end_at = rows[i].index(special.eot)
    for i in range(B):
        states[i].done = special.mask not in rows[i]

    step = 0
    est_step = 0.0
    while not all(s.done for s in states):
        if should_stop is not None and should_stop():
            raise DecodeCancelled()
        active = [i for i in range(B) if not states[i].done]
        width = L
        a = attn[active]
        if opts.trim_tail:
            ends = [states[i].end_at for i in active]
            width = L if None in ends else max(e + 1 for e in ends if e is not None)
            # each row's own padding is masked out too, so a row decodes the same in any batch
            for r, e in enumerate(ends):
                if e is not None:
                    a[r, P + e + 1 :] = 0
        block = torch.tensor([rows[i][:width] for i in active], dtype=torch.long)
        x = ids[active][:, : P + width]
        x[:, P:] = block
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = logits_fn(x, a[:, : P + width], P)
        pp = _propose(logits, block, [states[i].end_at for i in active], special, opts)
        now = time.perf_counter()
        dt = now - t0
        est_step = dt if est_step == 0.0 else 0.5 * est_step + 0.5 * dt
        # no time for another pass after this one: fill everything from these logits
        late = opts.deadline is not None and now + est_step > opts.deadline
        final = late or step + 1 >= opts.steps  # steps is a hard cap
        for a, i in enumerate(active):
            st = states[i]
            commits = _fill_all(rows[i], pp, a, special, opts, st) if final else _pick(
                rows[i], st, pp, a, step, special, opts
            )
            for j, t, c in commits:
                rows[i][j], conf[i][j] = t, c
            if _close_after_end(rows[i], special) and st.end_at is None:
                st.end_at = rows[i].index(special.eot)
            if final and special.mask in rows[i]:  # masks left after the end token
                rows[i] = [special.pad if t == special.mask else t for t in rows[i]]
            st.stats.steps += 1
            st.stats.tokens_per_step.append(len(commits))
            st.stats.step_times.append(dt)
            st.stats.deadline_hit = st.stats.deadline_hit or (late and final)
            st.done = special.mask not in rows[i]
        step += 1
    total = time.perf_counter() - t_start
    results = []
    for i in range(B):
        row = rows[i]
        cut = next((j for j, t in enumerate(row) if t in (special.eot, special.pad)), L)
        states[i].stats.total_s = total
        results.append(BlockResult(row[:cut], row, conf[i], special.eot in row, states[i].stats))
    return results


def _close_after_end(row: list[int], special: SpecialTokens) -> bool:
    """Once an end token is committed, everything after it is padding. Returns True if ended."""
    if special.eot not in row:
        return False
    j = row.index(special.eot)
    row[j + 1 :] = [special.pad] * (len(row) - j - 1)
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

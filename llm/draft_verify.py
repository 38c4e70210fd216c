"""Draft-and-verify decoding of a block diffusion LM (`llm.block_lm`): the block's parallel
denoising pass drafts the next tokens, the same model's causal reading checks them, and
every pass commits the longest checked prefix plus one token.

The BDLM is trained both ways on every example: its noisy blocks bidirectionally (the
diffusion objective) and its clean copy causally (the AR loss that scores each block's first
token). One forward pass serves both:

- causal rows: the last committed token and the draft after it, at their positions; row j's
  hidden state scores position j + 1 given everything before it, as an AR model would;
- mask rows: the rest of a ``block``-wide window, denoised in parallel against the causal
  rows (bidirectional among themselves, as in training): the draft for the next pass.

The draft is accepted left to right while each token is the one the causal reading picks
there (greedy, with the same repeat rules as `llm.block_decoder`: no token twice in a row,
no trigram said twice); the first token it would not pick is replaced by the one it does,
and the rest of the draft is kept as the next pass's guess. The reply is therefore exactly
the model's own greedy causal reply, whatever the draft holds: drafts only decide how many
tokens a pass commits (one when the draft's first token is wrong, up to ``block`` + 1 when
it is all right). Finished tokens stay in the key/value cache; the rejected draft and the
mask rows are cropped off.

Anytime, as `llm.block_decoder`: past the wall-clock deadline the reply ends at the last
sentence end it holds, or at the next one it writes; ``overrun_s`` later, where it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import DynamicCache

from llm.block_decoder import BlockDiffusionDecoder, BlockOptions
from llm.decoder import BlockResult, DecodeCancelled, DecodeStats


def _pick(dec: BlockDiffusionDecoder, probs: torch.Tensor, said: list[int], opts: BlockOptions) -> tuple[int, float]:
    """The causal reading's token at the next position after ``said``: its most likely one
    that neither repeats the token before it nor ends a trigram ``said`` already holds."""
    top_p, top_t = probs.topk(8)
    left = said[-1] if said else None
    banned = dec._repeated_ngram_ends(said, [], 0, opts.no_repeat_ngram)
    ends = dec.special.end_ids
    for k in range(top_t.shape[0]):
        t = int(top_t[k])
        if t in ends or ((not opts.no_adjacent_repeat or t != left) and t not in banned):
            return t, float(top_p[k])
    return int(top_t[-1]), float(top_p[-1])


@torch.no_grad()
def generate_verified(
    dec: BlockDiffusionDecoder, prompt: list[int], opts: BlockOptions, should_stop: Callable[[], bool] | None = None
) -> BlockResult:
    sp, w = dec.special, opts.block
    ends = set(sp.end_ids)
    t0 = time.perf_counter()
    stats = DecodeStats()
    cache = DynamicCache()
    # the prompt (causal) and a window of masks: the first token and a draft of what follows
    # (each row scores the position after it; the last mask row's is past the window)
    h = dec._forward(prompt + [sp.mask] * w, 0, cache, causal_rows=len(prompt))
    cache.crop(-w)
    nxt, p = _pick(dec, dec._probs(h[len(prompt) - 1: len(prompt)])[0], [], opts)
    draft = dec._probs(h[len(prompt): -1]).argmax(-1).tolist()
    stats.steps += 1
    stats.tokens_per_step.append(1)
    stats.step_times.append(time.perf_counter() - t0)
    out, conf = [nxt], [p]
    ended = nxt in ends
    stopped = False
    while not (ended or stopped) and len(out) < opts.max_tokens:
        if should_stop is not None and should_stop():
            raise DecodeCancelled()
        ts = time.perf_counter()
        q = len(prompt) + len(out) - 1  # the position of the last committed token, not yet cached
        draft = draft[: max(0, min(w, opts.max_tokens - len(out)))]
        m = len(draft)
        rows = [out[-1], *draft]
        hb = dec._forward(rows + [sp.mask] * (w - len(draft)), q, cache, causal_rows=len(rows))
        probs = dec._probs(hb)
        k = 0  # draft tokens accepted
        while True:
            t, p = _pick(dec, probs[k], out, opts)
            out.append(t)
            conf.append(p)
            if t in ends or len(out) >= opts.max_tokens:
                ended = t in ends
                break
            if k < len(draft) and draft[k] == t:
                k += 1
                continue
            break
        cache.crop(-(w - k))  # the last committed token and the accepted draft stay cached
        # the next guess: after a corrected token, the rest of the draft and the causal
        # reading after it; then the mask rows' denoised tokens (row i scores position q+i+1)
        guess = probs.argmax(-1).tolist()
        draft = (draft[k + 1:] + guess[m: m + 1] if k < m else []) + guess[m + 1: w]
        now = time.perf_counter()
        stats.steps += 1
        stats.tokens_per_step.append(k + 1)
        stats.step_times.append(now - ts)
        if opts.deadline is not None and now >= opts.deadline:
            stats.deadline_hit = True
            known = [t for t in out if t not in ends]
            cut = max((i + 1 for i, t in enumerate(known) if t in dec.sentence_ends), default=None)
            if cut is not None or now >= opts.deadline + opts.overrun_s:
                out, conf = known[: cut or len(known)], conf[: cut or len(known)]
                ended, stopped = cut is not None, True
    if out and out[-1] in ends:
        out, conf = out[:-1], conf[:-1]
    stats.total_s = time.perf_counter() - t0
    return BlockResult(ids=out, block=out + ([sp.eot] if ended else []), confidence=conf, ended=ended, stats=stats)

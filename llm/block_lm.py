"""Block diffusion on a causal LM: the layout, attention masks and training loss.

The block diffusion LM (BDLM) is the AR baseline's GPT-2 network, adapted as Fast-dLLM v2
adapts an AR model: the reply is cut into blocks of ``b`` tokens; attention is causal across
blocks and bidirectional inside the block being denoised; finished blocks are ordinary
causal context whose keys and values are cached. Predictions are shifted as in the AR
model (the hidden state at position i scores token i+1), so the first token of a block is
scored by the last finished position, exactly as the AR model scores it, and the AR weights
are a good start rather than a foreign one.

Training sees each example once as ``[prompt | clean reply | noisy reply]`` (BD3-LM's
concatenation): the clean copy is causal, and noisy block k attends to the prompt, the clean
blocks before k, and itself. Every block gets its own mask rate t ~ U(0, 1). The loss is the
masked positions' cross-entropy plus the clean copy's AR loss, so the model keeps the AR
skill that scores each block's first token. The reply area is ``REPLY_LEN`` tokens: the
reply, its end-of-turn token, and more end tokens (weighted down) up to the area's end, so a
position after the end learns "the reply is over" and a block that holds the end finishes in
the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

PROMPT_LEN = 32
REPLY_LEN = 32


@dataclass(frozen=True)
class Example:
    prompt: list[int]  # <bos> ... <agent>
    reply: list[int]  # reply tokens + <eot>, at most REPLY_LEN


@dataclass
class Batch:
    ids: torch.Tensor  # [n, L]
    positions: torch.Tensor  # [n, L]
    attention: torch.Tensor  # [n, 1, L, L] bool, True = may attend
    noisy_at: torch.Tensor  # [n, REPLY_LEN] bool: masked in the noisy copy
    weight: torch.Tensor  # [n, REPLY_LEN]: 1 on the reply and its end token, tail_weight after
    target: torch.Tensor  # [n, REPLY_LEN]
    reply_len: torch.Tensor  # [n]
    block: int


def block_attention(prompt_valid: torch.Tensor, block: int) -> torch.Tensor:
    """[n, 1, L, L] mask for ``[prompt | clean | noisy]``. ``prompt_valid`` [n, PROMPT_LEN]
    marks real (not left-padding) prompt positions."""
    n = prompt_valid.shape[0]
    p, r = PROMPT_LEN, REPLY_LEN
    length = p + 2 * r
    m = torch.zeros((n, length, length), dtype=torch.bool)
    causal = torch.tril(torch.ones((p + r, p + r), dtype=torch.bool))
    m[:, : p + r, : p + r] = causal
    m[:, :, :p] &= prompt_valid[:, None, :]
    blk = torch.arange(r) // block
    # noisy row j: the prompt, clean blocks before its own, and its own noisy block
    m[:, p + r :, :p] = prompt_valid[:, None, :]
    m[:, p + r :, p : p + r] = (blk[None, :] < blk[:, None])[None]
    m[:, p + r :, p + r :] = (blk[None, :] == blk[:, None])[None]
    m |= torch.eye(length, dtype=torch.bool)[None]  # a left-padding row attends to itself
    return m[:, None]


def predictor_index(block: int) -> torch.Tensor:
    """Sequence index whose hidden state scores reply position r: the last clean position
    before r's block for a block's first token, else the noisy position before r."""
    r = torch.arange(REPLY_LEN)
    first = r % block == 0
    return torch.where(first, PROMPT_LEN + r - 1, PROMPT_LEN + REPLY_LEN + r - 1)


def make_batch(
    items: list[Example], block: int, mask_id: int, pad_id: int, eot_id: int, gen: torch.Generator,
    tail_weight: float = 0.2,
) -> Batch:
    n, p, r = len(items), PROMPT_LEN, REPLY_LEN
    clean = torch.full((n, r), eot_id, dtype=torch.long)
    prompt = torch.full((n, p), pad_id, dtype=torch.long)
    valid = torch.zeros((n, p), dtype=torch.bool)
    weight = torch.full((n, r), tail_weight)
    lens = torch.zeros(n, dtype=torch.long)
    for i, it in enumerate(items):
        prompt[i, p - len(it.prompt) :] = torch.tensor(it.prompt)
        valid[i, p - len(it.prompt) :] = True
        clean[i, : len(it.reply)] = torch.tensor(it.reply)
        weight[i, : len(it.reply)] = 1.0
        lens[i] = len(it.reply)
    n_blocks = r // block
    t = torch.rand((n, n_blocks), generator=gen).clamp_min(1.0 / block)
    noisy_at = torch.rand((n, r), generator=gen) < t.repeat_interleave(block, dim=1)
    noisy = clean.masked_fill(noisy_at, mask_id)
    start = p - valid.sum(1, keepdim=True)  # where each prompt begins
    ppos = (torch.arange(p)[None] - start).clamp_min(0)
    rpos = valid.sum(1, keepdim=True) + torch.arange(r)[None]
    return Batch(
        ids=torch.cat([prompt, clean, noisy], 1),
        positions=torch.cat([ppos, rpos, rpos], 1),
        attention=block_attention(valid, block),
        noisy_at=noisy_at, weight=weight, target=clean, reply_len=lens, block=block,
    )


def loss(model: torch.nn.Module, b: Batch, ar_weight: float = 0.5) -> torch.Tensor:
    """Masked-position cross-entropy of the noisy copy, plus ``ar_weight`` x the clean copy's
    AR loss over the reply and its end token. ``model`` is a `GPT2LMHeadModel`."""
    hidden = model.transformer(input_ids=b.ids, attention_mask=b.attention, position_ids=b.positions).last_hidden_state
    head = model.lm_head
    rows = torch.arange(b.ids.shape[0])[:, None]
    pred = hidden[rows, predictor_index(b.block)[None, :]]  # [n, REPLY_LEN, H]
    sel = b.noisy_at
    ce = F.cross_entropy(head(pred[sel]), b.target[sel], reduction="none")
    w = b.weight[sel]
    diff = (ce * w).sum() / w.sum().clamp_min(1.0)
    real = torch.arange(REPLY_LEN)[None, :] < b.reply_len[:, None]
    clean_pred = hidden[:, PROMPT_LEN - 1 : PROMPT_LEN + REPLY_LEN - 1]
    ar = F.cross_entropy(head(clean_pred[real]), b.target[real])
    return diff + ar_weight * ar

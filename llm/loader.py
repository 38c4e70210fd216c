"""Load a masked diffusion LM from a local directory (never from a hub).

Four families share one loading interface (`LoadedLM`):

- ``bdlm``: the embedded block diffusion LM in ``llm/weights/bdlm`` (the default): GPT-2
  adapted from the AR baseline to block diffusion (`llm.block_lm`), decoded by
  `llm.block_decoder` with a cache of finished blocks;
- ``masked_lm`` with this project's chat tokenizer: the embedded ModernBERT MDLM in
  ``llm/weights/mdlm`` (it also carries the turn-end probe, `llm.turn_end`), or any
  retrained copy;
- ``masked_lm`` with a Hugging Face tokenizer: any local `AutoModelForMaskedLM` directory,
  e.g. ModernBERT-based chat MDLMs; the prompt uses the tokenizer's chat template if it has
  one;
- ``llada`` / ``dream``: LLaDA- and Dream-style checkpoints with remote code
  (``trust_remote_code``). Each has its own mask id and chat template; Dream predicts token
  i from position i-1, so its logits are shifted. Their published modeling code targets
  transformers 4.38 (LLaDA) and 4.46 (Dream); with transformers 5.x it needs a patched copy
  (see README).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from llm.config import LlmConfig
from llm.decoder import LogitsFn, SpecialTokens
from llm.tokenizer import EOT, MASK, ChatTokenizer

EMBEDDED = Path(__file__).parent / "weights" / "bdlm"  # the default reply model
EMBEDDED_MDLM = Path(__file__).parent / "weights" / "mdlm"
# mask token of the released checkpoints, by string and by id, for when neither config.json
# nor the tokenizer names one
MASK_TOKENS = {"llada": "<|mdm_mask|>", "dream": "<|mask|>"}
DEFAULT_MASK_IDS = {"llada": 126336, "dream": 151666}
# chat-format tokens that end an assistant turn besides the tokenizer's eos/pad
TURN_END_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end|>")


class ModelLoadError(RuntimeError):
    pass


PromptFn = Callable[[str, list[tuple[str, str]], int], list[int]]


@dataclass
class LoadedLM:
    kind: str
    model: torch.nn.Module
    logits_fn: LogitsFn
    special: SpecialTokens
    prompt_ids: PromptFn  # (user_text, history, max_len) -> ids ending where the reply starts
    decode: Callable[[list[int]], str]
    path: Path


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def detect_kind(path: Path) -> str:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path / 'config.json'} is not readable JSON: {exc}") from exc
    if cfg.get("block_diffusion"):
        return "bdlm"
    mt = str(cfg.get("model_type", "")).lower()
    if "llada" in mt:
        return "llada"
    if "dream" in mt:
        return "dream"
    return "masked_lm"


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX or AVX512-BF16). Elsewhere
    bfloat16 is emulated and slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def torch_dtype(name: str) -> torch.dtype:
    """``auto``, ``float32`` or ``bfloat16`` as a torch dtype (``auto``: bfloat16 where native)."""
    if name == "auto":
        return torch.bfloat16 if native_bf16() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_lm(cfg: LlmConfig) -> LoadedLM:
    """The model ``cfg`` names, in ``cfg.dtype``; logits always come back as float32."""
    _offline()
    path = Path(cfg.model_path).expanduser() if cfg.model_path else EMBEDDED
    if not path.is_dir():
        raise ModelLoadError(f"no model directory at {path}")
    if not (path / "config.json").exists():
        raise ModelLoadError(f"no model at {path} (config.json missing)")
    kind = detect_kind(path) if cfg.kind == "auto" else cfg.kind
    try:
        dtype = torch_dtype(cfg.dtype)
        if kind == "masked_lm":
            return _load_masked_lm(path, dtype)
        if kind == "bdlm":
            return _load_bdlm(path, dtype)
        return _load_remote(path, kind, dtype)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers raises many types; name the path
        raise ModelLoadError(f"could not load {kind} model from {path}: {exc}") from exc


def _hidden_then_head(model: torch.nn.Module) -> LogitsFn:
    """ModernBERT: run the vocabulary head on the block positions only."""

    def fn(ids: torch.Tensor, attn: torch.Tensor, start: int) -> torch.Tensor:
        h = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, start:]
        return model.decoder(model.head(h)).float()

    return fn


def _full_logits(model: torch.nn.Module, shift: bool = False) -> LogitsFn:
    def fn(ids: torch.Tensor, attn: torch.Tensor, start: int) -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
        if shift:  # position i predicts token i+1 (Dream)
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits[:, start:]

    return fn


def _load_masked_lm(path: Path, dtype: torch.dtype) -> LoadedLM:
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    model.eval()
    has_head = hasattr(model, "head") and hasattr(model, "decoder")
    logits_fn = _hidden_then_head(model) if has_head else _full_logits(model)
    tok_file = path / "tokenizer.json"
    if tok_file.exists() and _has_chat_tokens(tok_file):
        tok = ChatTokenizer.load(path)
        sp = tok.special
        special = SpecialTokens(mask=sp.mask, eot=sp.eot, pad=sp.pad, forbidden=(sp.bos, sp.sep))
        return LoadedLM("masked_lm", model, logits_fn, special, _chat_prompt(tok), tok.decode, path)
    return _hf_tokenizer_lm("masked_lm", model, logits_fn, path, None)


def _chat_prompt(tok: ChatTokenizer) -> PromptFn:
    def prompt_ids(text: str, history: list[tuple[str, str]], max_len: int) -> list[int]:
        ctx = " ".join([f"{u} {a}" for u, a in history] + [text])
        return tok.prompt_ids(ctx, max_len)

    return prompt_ids


def _load_bdlm(path: Path, dtype: torch.dtype) -> LoadedLM:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(str(path), local_files_only=True, dtype=dtype).eval()
    tok = ChatTokenizer.load(path)
    sp = tok.special
    special = SpecialTokens(mask=sp.mask, eot=sp.eot, pad=sp.pad, forbidden=(sp.bos, sp.sep))
    # logits_fn is the plain causal reading (for judges); replies go through llm.block_decoder
    return LoadedLM("bdlm", model, _full_logits(model), special, _chat_prompt(tok), tok.decode, path)


def _has_chat_tokens(tok_file: Path) -> bool:
    text = tok_file.read_text()
    return f'"{MASK}"' in text and f'"{EOT}"' in text


def _hf_tokenizer_lm(
    kind: str, model: torch.nn.Module, logits_fn: LogitsFn, path: Path, mask_id: int | None
) -> LoadedLM:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=kind != "masked_lm")
    vocab = tok.get_vocab()
    if mask_id is None:
        mask_id = tok.mask_token_id
    if mask_id is None and kind in MASK_TOKENS:
        mask_id = vocab.get(MASK_TOKENS[kind], DEFAULT_MASK_IDS[kind])
    if mask_id is None:
        raise ModelLoadError(f"{path}: no mask token (neither config.json nor the tokenizer names one)")
    n_logits = int(getattr(model.config, "vocab_size", 0) or 0)
    if n_logits and not 0 <= mask_id < n_logits:
        raise ModelLoadError(f"{path}: mask token id {mask_id} is outside the model's vocabulary of {n_logits}")
    eot = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    if eot is None:
        raise ModelLoadError(f"{path}: tokenizer has no end token (eos or sep)")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eot
    ends = tuple(vocab[t] for t in TURN_END_TOKENS if t in vocab and vocab[t] not in (eot, pad, mask_id))
    forbidden = tuple(
        i for i in (tok.bos_token_id, tok.cls_token_id) if i is not None and i not in (eot, pad, mask_id, *ends)
    )
    special = SpecialTokens(mask=mask_id, eot=eot, pad=pad, forbidden=forbidden, ends=ends)

    def prompt_ids(text: str, history: list[tuple[str, str]], max_len: int) -> list[int]:
        msgs = []
        for u, a in history:
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        msgs.append({"role": "user", "content": text})
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding by default
                ids = ids["input_ids"]
        else:
            ids = tok("".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:")["input_ids"]
        return list(ids)[-max_len:]

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True).strip()

    return LoadedLM(kind, model, logits_fn, special, prompt_ids, decode, path)


def _load_remote(path: Path, kind: str, dtype: torch.dtype) -> LoadedLM:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path), local_files_only=True, trust_remote_code=True, dtype=dtype)
    model.eval()
    mask = getattr(model.config, "mask_token_id", None)
    shift = kind == "dream"  # Dream predicts token i from position i-1
    return _hf_tokenizer_lm(kind, model, _full_logits(model, shift=shift), path, None if mask is None else int(mask))

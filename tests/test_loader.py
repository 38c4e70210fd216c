"""Loading checkpoints from local directories, offline: a ModernBERT masked-LM directory with
a Hugging Face tokenizer and chat template, and LLaDA- and Dream-style remote-code directories.
Every directory is built here with a tiny randomly initialised model of the same interface as
the released checkpoints (config.json + weights + tokenizer + modeling code for remote code)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import ModernBertConfig, ModernBertForMaskedLM, PreTrainedTokenizerFast

from llm.decoder import DecodeOptions, generate_block
from llm.loader import EMBEDDED, EMBEDDED_MDLM, ModelLoadError, load_lm, native_bf16, torch_dtype
from llm.responder import Responder
from llm.sentence_case import sentence_case
from pipelines.config import LlmConfig

torch.set_num_threads(1)

WORDS = "hello hi there how are you doing good fine thanks what is your name the a yes no okay bye".split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }} {{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def make_tokenizer(specials: list[str], **roles: str) -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(specials + ["user", "assistant", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", **roles)
    tok.add_special_tokens({"additional_special_tokens": [s for s in specials if s not in roles.values()]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_masked_lm_dir(path: Path) -> PreTrainedTokenizerFast:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<|start|>", "<|end|>"]
    tok = make_tokenizer(
        specials,
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        eos_token="<|end|>",
        bos_token="[CLS]",
    )
    torch.manual_seed(0)
    cfg = ModernBertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
        global_attn_every_n_layers=1,
        local_attention=128,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.eos_token_id,
        cls_token_id=tok.cls_token_id,
        sep_token_id=tok.sep_token_id,
        mask_token_id=tok.mask_token_id,
    )
    ModernBertForMaskedLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return tok


CONFIGURATION_PY = """
from transformers import PretrainedConfig


class TinyDiffusionConfig(PretrainedConfig):
    model_type = "{model_type}"

    def __init__(self, vocab_size=64, d_model=32, n_layers=2, n_heads=2, mask_token_id=None, **kwargs):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.mask_token_id = mask_token_id
        super().__init__(**kwargs)
"""

MODELING_PY = '''
import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_tiny import TinyDiffusionConfig


class TinyDiffusionModel(PreTrainedModel):
    """Bidirectional transformer with a vocabulary head: LLaDA's and Dream's interface
    (forward(input_ids, attention_mask) -> .logits over the whole sequence)."""

    config_class = TinyDiffusionConfig
    base_model_prefix = "tiny"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(256, config.d_model)
        layer = nn.TransformerEncoderLayer(config.d_model, config.n_heads, 2 * config.d_model, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.5)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.embed(input_ids) + self.pos(pos)[None]
        pad = None if attention_mask is None else attention_mask == 0
        h = self.encoder(h, src_key_padding_mask=pad)
        return CausalLMOutput(logits=self.lm_head(h))
'''


def build_remote_dir(path: Path, kind: str, mask_in_config: bool = True) -> PreTrainedTokenizerFast:
    """A directory shaped like LLaDA-8B-Instruct (``model_type: llada``, mask ``<|mdm_mask|>``,
    ``<|eot_id|>`` ending turns) or Dream-v0-Instruct (``model_type: Dream``, mask ``<|mask|>``,
    ``<|im_end|>`` ending turns), with the tokenizer's own mask token unset as in the releases."""
    mask_tok, end_tok = ("<|mdm_mask|>", "<|eot_id|>") if kind == "llada" else ("<|mask|>", "<|im_end|>")
    specials = ["<|endoftext|>", "[UNK]", "<|start|>", "<|end|>", end_tok, mask_tok]
    tok = make_tokenizer(specials, pad_token="<|endoftext|>", eos_token="<|endoftext|>", bos_token="<|start|>")
    model_type = "llada" if kind == "llada" else "Dream"
    (path / "configuration_tiny.py").write_text(textwrap.dedent(CONFIGURATION_PY.format(model_type=model_type)))
    (path / "modeling_tiny.py").write_text(textwrap.dedent(MODELING_PY))
    torch.manual_seed(1)
    state = {
        "embed.weight": torch.randn(len(tok), 32) * 0.5,
        "pos.weight": torch.randn(256, 32) * 0.5,
        "lm_head.weight": torch.randn(len(tok), 32) * 0.5,
        "lm_head.bias": torch.zeros(len(tok)),
    }
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    for i in range(2):
        for k, v in layer.state_dict().items():
            state[f"encoder.layers.{i}.{k}"] = v.clone()
    from safetensors.torch import save_file

    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "model_type": model_type,
        "architectures": ["TinyDiffusionModel"],
        "auto_map": {
            "AutoConfig": "configuration_tiny.TinyDiffusionConfig",
            "AutoModel": "modeling_tiny.TinyDiffusionModel",
        },
        "vocab_size": len(tok),
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    if mask_in_config:
        cfg["mask_token_id"] = tok.convert_tokens_to_ids(mask_tok)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    tok.save_pretrained(path)
    return tok


def test_local_masked_lm_directory_loads_and_generates(tmp_path: Path) -> None:
    tok = build_masked_lm_dir(tmp_path)
    cfg = LlmConfig(model_path=str(tmp_path), steps=4, block_len=12, sub_block=12)
    lm = load_lm(cfg)
    assert lm.kind == "masked_lm"
    assert lm.special.mask == tok.mask_token_id
    assert lm.special.eot == tok.eos_token_id and lm.special.pad == tok.pad_token_id
    prompt = lm.prompt_ids("how are you", [], 64)
    expected = tok.apply_chat_template([{"role": "user", "content": "how are you"}], add_generation_prompt=True)
    assert prompt == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert tok.convert_ids_to_tokens(prompt[-2:]) == ["<|start|>", "assistant"]
    reply = Responder(lm, cfg).generate("how are you")
    assert len(reply.block) == 12 and tok.mask_token_id not in reply.block
    assert tok.mask_token_id not in reply.ids and tok.cls_token_id not in reply.ids
    # the text is the tokens', each sentence begun upper case (llm.sentence_case)
    assert reply.text == sentence_case(tok.decode(reply.ids, skip_special_tokens=True).strip())


def test_history_goes_through_the_chat_template(tmp_path: Path) -> None:
    tok = build_masked_lm_dir(tmp_path)
    lm = load_lm(LlmConfig(model_path=str(tmp_path)))
    ids = lm.prompt_ids("what is your name", [("hello", "hi there")], 64)
    text = tok.decode(ids)
    assert text.index("hello") < text.index("there") < text.index("name")


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_remote_code_directory_loads_and_generates(tmp_path: Path, kind: str) -> None:
    tok = build_remote_dir(tmp_path, kind)
    cfg = LlmConfig(model_path=str(tmp_path), steps=4, block_len=10, sub_block=10, tau=0.9)
    lm = load_lm(cfg)
    assert lm.kind == kind
    mask_tok, end_tok = ("<|mdm_mask|>", "<|eot_id|>") if kind == "llada" else ("<|mask|>", "<|im_end|>")
    assert lm.special.mask == tok.convert_tokens_to_ids(mask_tok)
    assert lm.special.eot == tok.eos_token_id
    assert tok.convert_tokens_to_ids(end_tok) in lm.special.ends
    assert type(lm.model).__name__ == "TinyDiffusionModel"
    reply = Responder(lm, cfg).generate("hello how are you")
    assert len(reply.block) == 10 and lm.special.mask not in reply.block
    assert not set(lm.special.end_ids) & set(reply.ids)


def test_dream_logits_are_shifted_and_llada_are_not(tmp_path: Path) -> None:
    for kind in ("llada", "dream"):
        d = tmp_path / kind
        d.mkdir()
        build_remote_dir(d, kind)
        lm = load_lm(LlmConfig(model_path=str(d), dtype="float32"))
        ids = torch.tensor([[2, 10, 11, 12, 5, 5, 5]])
        attn = torch.ones_like(ids)
        with torch.no_grad():
            full = lm.model(input_ids=ids, attention_mask=attn).logits
            got = lm.logits_fn(ids, attn, 4)
        want = full[:, 3:6] if kind == "dream" else full[:, 4:]
        assert torch.allclose(got, want, atol=1e-5), kind


@pytest.mark.skipif(not (EMBEDDED / "model.safetensors").exists(), reason="embedded weights not trained yet")
def test_dtype_is_configurable_and_logits_stay_float32() -> None:
    assert torch_dtype("auto") == (torch.bfloat16 if native_bf16() else torch.float32)
    ids = torch.tensor([[2, 10, 11, 12, 5, 5, 5]])
    attn = torch.ones_like(ids)
    out = {}
    for name in ("float32", "bfloat16"):
        lm = load_lm(LlmConfig(dtype=name))
        assert lm.model.dtype == torch_dtype(name)
        with torch.no_grad():
            out[name] = lm.logits_fn(ids, attn, 4)
        assert out[name].dtype == torch.float32  # the decoder's probabilities are float32 either way
    # bfloat16 keeps about 3 significant digits: the same distributions, not the same bits
    p32, p16 = out["float32"].softmax(-1), out["bfloat16"].softmax(-1)
    assert (p32 - p16).abs().max() < 0.05


def test_mask_id_from_the_tokenizer_when_config_has_none(tmp_path: Path) -> None:
    tok = build_remote_dir(tmp_path, "llada", mask_in_config=False)
    lm = load_lm(LlmConfig(model_path=str(tmp_path)))
    assert lm.special.mask == tok.convert_tokens_to_ids("<|mdm_mask|>")


def test_published_mask_id_outside_a_tiny_vocab_is_a_clear_error(tmp_path: Path) -> None:
    build_remote_dir(tmp_path, "dream", mask_in_config=False)
    tok_cfg = tmp_path / "tokenizer.json"
    tok_cfg.write_text(tok_cfg.read_text().replace("<|mask|>", "<|unused|>"))
    with pytest.raises(ModelLoadError, match="outside the model's vocabulary"):
        load_lm(LlmConfig(model_path=str(tmp_path)))


def test_missing_model_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no model directory"):
        load_lm(LlmConfig(model_path=str(tmp_path / "nowhere")))
    with pytest.raises(ModelLoadError, match="config.json missing"):
        load_lm(LlmConfig(model_path=str(tmp_path)))


def test_broken_directories_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not readable JSON"):
        load_lm(LlmConfig(model_path=str(tmp_path)))
    build_masked_lm_dir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        load_lm(LlmConfig(model_path=str(tmp_path)))


def test_tokenizer_without_mask_token_is_a_clear_error(tmp_path: Path) -> None:
    build_masked_lm_dir(tmp_path)
    tc = tmp_path / "tokenizer_config.json"
    data = json.loads(tc.read_text())
    data.pop("mask_token", None)
    tc.write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="no mask token"):
        load_lm(LlmConfig(model_path=str(tmp_path)))


@pytest.mark.skipif(not (EMBEDDED / "model.safetensors").exists(), reason="embedded weights not trained yet")
def test_embedded_model_is_the_default() -> None:
    from llm.block_decoder import BlockDiffusionDecoder, BlockOptions

    lm = load_lm(LlmConfig())
    assert lm.kind == "bdlm" and lm.path == EMBEDDED
    res = BlockDiffusionDecoder(lm.model, lm.special).generate(lm.prompt_ids("hello", [], 32), BlockOptions())
    assert res.ids and lm.special.mask not in res.ids
    mdlm = load_lm(LlmConfig(model_path=str(EMBEDDED_MDLM)))  # the turn-end probe's model
    assert mdlm.kind == "masked_lm"
    block = generate_block(mdlm.logits_fn, mdlm.prompt_ids("hello", [], 32), mdlm.special, DecodeOptions(steps=2)).block
    assert mdlm.special.mask not in block

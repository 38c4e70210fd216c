"""Configurations of the two embedded models: a ModernBERT masked diffusion LM and a
GPT-2 autoregressive baseline with about the same parameter count."""

from __future__ import annotations

from transformers import GPT2Config, GPT2LMHeadModel, ModernBertConfig, ModernBertForMaskedLM

from llm.tokenizer import ChatTokenizer

HIDDEN = 256
LAYERS = 6
HEADS = 4
MAX_POSITIONS = 128


def mdlm_config(tok: ChatTokenizer) -> ModernBertConfig:
    sp = tok.special
    return ModernBertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=768,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        global_attn_every_n_layers=1,  # short sequences: every layer attends globally
        local_attention=MAX_POSITIONS,
        # ModernBERT's defaults point near id 50283; a small vocabulary must set them.
        pad_token_id=sp.pad,
        bos_token_id=sp.bos,
        eos_token_id=sp.eot,
        cls_token_id=sp.bos,
        sep_token_id=sp.sep,
        mask_token_id=sp.mask,
        tie_word_embeddings=True,
        embedding_dropout=0.0,
        attention_dropout=0.0,
        mlp_dropout=0.0,
    )


def ar_config(tok: ChatTokenizer) -> GPT2Config:
    sp = tok.special
    return GPT2Config(
        vocab_size=tok.vocab_size,
        n_positions=MAX_POSITIONS,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=1152,  # 4.5x: matches the MDLM parameter count (ModernBERT uses a gated MLP)
        bos_token_id=sp.bos,
        eos_token_id=sp.eot,
        pad_token_id=sp.pad,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    )


def new_mdlm(tok: ChatTokenizer) -> ModernBertForMaskedLM:
    return ModernBertForMaskedLM(mdlm_config(tok))


def new_ar(tok: ChatTokenizer) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(ar_config(tok))

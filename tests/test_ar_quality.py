"""The AR baseline's greedy KV-cache decoder (on a tiny random GPT-2 with the chat tokenizer)
and the quality measures the benchmark uses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from llm.ar import ArLM, ArLoadError
from llm.quality import Lexicon, at_least_as_good, distinct_n, paired_f1_diff, quality_report, token_f1, words
from llm.tokenizer import train_tokenizer

torch.set_num_threads(1)

TEXTS = [
    "hello there how are you doing today",
    "i am fine thanks and you",
    "what is your name",
    "can you hear me now",
    "yes i can hear you clearly",
    "goodbye and have a nice day",
] * 20


@pytest.fixture(scope="module")
def ar() -> ArLM:
    tok = train_tokenizer(TEXTS, 120)
    torch.manual_seed(0)
    sp = tok.special
    cfg = GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=sp.bos, eos_token_id=sp.eot, pad_token_id=sp.pad)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # peaked outputs, so greedy choices are not near-ties
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.3)
    return ArLM(model, tok)


def test_batched_greedy_equals_one_call_at_a_time(ar: ArLM) -> None:
    prompts = [ar.prompt_ids(t) for t in ("hello", "what is your name today", "can you hear me", "yes")]
    batched = ar.generate_batch(prompts, 12)
    for p, b in zip(prompts, batched, strict=True):
        single = ar.generate(p, 12)
        assert single.ids == b.ids and single.ended == b.ended and single.steps == b.steps


def test_greedy_matches_a_full_forward_without_cache(ar: ArLM) -> None:
    prompt = ar.prompt_ids("how are you doing")
    res = ar.generate(prompt, 8)
    seq = list(prompt)
    sp = ar.tok.special
    for _ in range(len(res.ids)):
        logits = ar.model(input_ids=torch.tensor([seq])).logits[0, -1]
        logits[[sp.pad, sp.bos, sp.sep, sp.mask]] = -float("inf")
        seq.append(int(logits.argmax()))
    assert seq[len(prompt):] == res.ids


def test_reply_never_contains_control_tokens_and_counts_useful_tokens(ar: ArLM) -> None:
    sp = ar.tok.special
    for r in ar.generate_batch([ar.prompt_ids(t) for t in TEXTS[:6]], 10):
        assert not {sp.pad, sp.bos, sp.sep, sp.mask, sp.eot} & set(r.ids)
        assert len(r.ids) <= 10
        assert r.useful_tokens == len(r.ids) + int(r.ended)
        assert r.steps == r.useful_tokens or (not r.ended and r.steps == len(r.ids))


def test_nll_is_lower_for_the_models_own_greedy_reply(ar: ArLM) -> None:
    prompt = ar.prompt_ids("hello there")
    own = ar.generate(prompt, 8)
    other = ar.tok.encode(" goodbye and have a nice day")
    nll_own, nll_other = ar.nll([prompt, prompt], [own.ids, other], [own.ended, True])
    assert nll_own < nll_other
    assert math.isnan(ar.nll([prompt], [[]], [False])[0])


def test_bad_input_is_a_clear_error(ar: ArLM, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ar.generate_batch([[]])
    assert ar.generate_batch([]) == []
    with pytest.raises(ArLoadError, match="no AR model"):
        ArLM.load(tmp_path)


def test_token_f1_and_words() -> None:
    assert words("I'm FINE, thanks!") == ["i'm", "fine", "thanks"]
    assert token_f1("i am fine", "I am fine.") == 1.0
    assert token_f1("fine", "i am fine") == pytest.approx(0.5)
    assert token_f1("", "") == 1.0 and token_f1("...", "hello") == 0.0


def test_distinct_and_repetition_measures_flag_degenerate_sets() -> None:
    varied = ["i like dogs a lot", "the weather is nice today", "see you later then"]
    same = ["i am good"] * 3
    assert distinct_n(varied) == 1.0
    assert distinct_n(same) == pytest.approx(2 / 6)
    q = quality_report(["i am good i am good"], ["ok"], [[5, 6, 5, 6]], [True])
    assert q.self_distinct_2 < 0.7
    dots = quality_report(["...."], ["ok"], [[7, 7, 7, 7]], [False])
    assert dots.adjacent_repeat_share == 1.0 and dots.empty_share == 1.0 and dots.ended_share == 0.0


def test_lexicon_tells_words_and_salad_from_corpus_text() -> None:
    lex = Lexicon(TEXTS)
    assert lex.known_share(["how are you"]) == 1.0
    assert lex.known_share(["you't"]) == 0.0
    assert lex.attested_share(["how are you doing"]) == 1.0
    assert lex.attested_share(["you how are"]) == 0.0


def test_equal_quality_rule_rejects_a_collapsed_model() -> None:
    refs = ["i am fine thanks", "my name is sam", "yes i hear you"]
    good = ["i am fine", "my name is bob", "yes i hear you well"]
    collapsed = ["i", "i", "i"]

    def report(texts: list[str]) -> object:
        return quality_report(texts, refs, [[1]] * 3, [True] * 3)

    assert at_least_as_good(report(good), report(good), paired_f1_diff(good, good, refs))
    assert not at_least_as_good(report(collapsed), report(good), paired_f1_diff(collapsed, good, refs))

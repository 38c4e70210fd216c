"""The embedded block diffusion LM answers held-out prompts with real replies, decoded the
way the agent decodes them (default LlmConfig), and the turn-end probe (on the embedded
MDLM) tells whole turns from cut ones. The test asserts quality bounds that a
collapsed model (empty or end-token replies) or a degenerate one (a block of "....", the same
reply to every prompt, a reply that loops, salad of word pieces) cannot meet; it never
asserts exact strings. Human replies to the same prompts score: 9.6 words, distinct-2 0.99,
self distinct-2 1.0, known words 0.99, attested trigrams 0.43. The bounds sit below that:
they catch degeneration and word salad; they do not certify good conversation."""

from __future__ import annotations

import random

import pytest
import torch

from llm.loader import EMBEDDED
from llm.quality import Lexicon, quality_report
from llm.turn_end import auc, examples, length_matched

torch.set_num_threads(1)

pytestmark = pytest.mark.skipif(
    not (EMBEDDED / "model.safetensors").exists(),
    reason=f"embedded weights missing: train them with `python -m llm.train --arch bdlm --out {EMBEDDED}`",
)

N_PROMPTS = 24


@pytest.fixture(scope="module")
def corpus() -> tuple[list, Lexicon]:
    pytest.importorskip("chitchat_dataset", reason="held-out prompts come from chitchat-dataset (extra 'train')")
    from llm.data import all_pairs, split_pairs

    train, held = split_pairs(all_pairs(1234), 300, 1234)  # llm.train's split: never trained on
    return held[:N_PROMPTS], Lexicon(p.response for p in train)


@pytest.fixture(scope="module")
def heldout(corpus: tuple[list, Lexicon]) -> list:
    return corpus[0]


@pytest.fixture(scope="module")
def responder():  # noqa: ANN201
    from llm.responder import Responder
    from pipelines.config import LlmConfig

    return Responder.load(LlmConfig())


def test_replies_to_heldout_prompts_meet_quality_bounds(responder, corpus: tuple[list, Lexicon]) -> None:  # noqa: ANN001
    heldout, lexicon = corpus
    replies = responder.generate_batch([p.prompt for p in heldout])
    texts = [r.text for r in replies]
    eot = responder.lm.special.eot
    q = quality_report(texts, [p.response for p in heldout], [r.ids for r in replies],
                       [eot in r.block for r in replies], lexicon=lexicon)
    summary = f"{q.as_dict()} samples={texts[:4]}"
    assert q.empty_share == 0.0, summary  # no collapse to an immediate end token
    assert q.mean_words >= 3.0, summary
    assert q.distinct_2 >= 0.2, summary  # not one reply for all prompts, not a repeated filler
    assert q.self_distinct_2 >= 0.8, summary  # replies do not loop
    assert q.adjacent_repeat_share <= 0.1, summary
    assert q.known_word_share >= 0.9, summary  # real words, not glued word pieces
    assert q.attested_trigram_share >= 0.3, summary  # word sequences people write, not salad
    assert q.token_f1 >= 0.05, summary  # some overlap with what a person answered
    # no block gets more than its pass budget: the prompt's pass plus at most `steps` per block
    blocks = -(-responder.cfg.max_tokens // responder.cfg.block_len)
    assert all(r.stats.steps <= 1 + blocks * responder.cfg.steps for r in replies)


def test_reply_ends_within_the_block_and_is_clean_text(responder, heldout: list) -> None:  # noqa: ANN001
    sp = responder.lm.special
    replies = [responder.generate(p.prompt) for p in heldout[:6]]
    for r in replies:
        assert r.text and r.text == r.text.strip()
        assert not r.text[0].islower(), r.text  # sentence case (llm.sentence_case)
        assert "<mask>" not in r.text and "<eot>" not in r.text and "<pad>" not in r.text
        assert sp.mask not in r.block
    assert sum(sp.eot in r.block for r in replies) >= 4  # most replies end inside the block


def test_phone_persona_prompts_get_distinct_replies(responder) -> None:  # noqa: ANN001
    prompts = ["Hello?", "Can you hear me?", "I want to talk to a person.", "Thanks, goodbye!"]
    texts = [responder.generate(p).text for p in prompts]
    assert all(len(t.split()) >= 2 for t in texts), texts
    assert len(set(texts)) >= 3, texts


def test_turn_end_probe_tells_whole_turns_from_cut_ones(responder, corpus: tuple[list, Lexicon]) -> None:  # noqa: ANN001
    from llm.data import all_pairs, split_pairs

    # held-out prompts (never seen by the probe), each whole and cut after a random word
    assert responder.turn_end is not None, "the embedded MDLM ships llm/weights/mdlm/turn_end.json"
    _, held = split_pairs(all_pairs(1234), 300, 1234)
    texts, labels = examples([p.prompt for p in held[:150]], random.Random(7))
    probs = responder.turn_end.probs(responder.probe_lm, texts)
    assert auc(probs, labels) >= 0.65
    assert all(0.0 <= p <= 1.0 for p in probs)
    # and with the word count no help: a whole prompt against a longer one cut to its length
    texts, labels = length_matched([p.prompt for p in held[:150]], random.Random(7))
    assert auc(responder.turn_end.probs(responder.probe_lm, texts), labels) >= 0.65
    # short answers read as whole, fragments of the same length as not
    whole = responder.turn_end.probs(responder.probe_lm, ["yes", "10 of clubs", "John Smith"])
    cut = responder.turn_end.probs(responder.probe_lm, ["I need", "I would like", "my name is"])
    assert min(whole) > max(cut), (whole, cut)
    # punctuation is not what it reads: a full stop after a fragment does not make it whole
    assert responder.turn_end_prob("I was wondering if you could.") == pytest.approx(
        responder.turn_end_prob("I was wondering if you could"), abs=1e-6)


def test_turn_end_probe_reads_the_same_in_any_dtype() -> None:
    from llm.responder import Responder
    from pipelines.config import LlmConfig

    # the probe was fitted on float32 features; a bfloat16 model gets float32 features for it
    texts = ["He was not an ill-disposed young man.", "10 of clubs", "I would like to book a"]
    r32, r16 = Responder.load(LlmConfig(dtype="float32")), Responder.load(LlmConfig(dtype="bfloat16"))
    assert r16.lm.model.dtype == torch.bfloat16
    assert r16.turn_end is not None and r32.turn_end is not None
    assert r16.turn_end.probs(r16.probe_lm, texts) == pytest.approx(
        r32.turn_end.probs(r32.probe_lm, texts), abs=1e-5)

"""Block diffusion: the decoder's cached passes see exactly what training showed the model,
and its commit rules (leftmost first, ends only at the left, no adjacent repeats, tau,
deadline, cancellation) hold. Real weights throughout (the AR baseline's network, which the
block diffusion LM shares)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch
from transformers import DynamicCache, GPT2LMHeadModel

from llm import block_lm
from llm.ar import AR_WEIGHTS
from llm.block_decoder import BlockDiffusionDecoder, BlockOptions
from llm.config import LlmConfig
from llm.decoder import DecodeCancelled, SpecialTokens
from llm.tokenizer import ChatTokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def parts() -> tuple[GPT2LMHeadModel, ChatTokenizer, BlockDiffusionDecoder]:
    model = GPT2LMHeadModel.from_pretrained(str(AR_WEIGHTS), dtype=torch.float32).eval()
    tok = ChatTokenizer.load(AR_WEIGHTS)
    sp = tok.special
    return model, tok, BlockDiffusionDecoder(model, SpecialTokens(sp.mask, sp.eot, sp.pad, (sp.bos, sp.sep)))


@torch.no_grad()
def test_cached_pass_matches_the_training_layout(parts) -> None:  # noqa: ANN001
    model, tok, dec = parts
    sp, b = tok.special, 4
    prompt = tok.prompt_ids("I'm calling about my order.", block_lm.PROMPT_LEN)
    reply = tok.encode(" Sure, what is your order number?") + [sp.eot]
    batch = block_lm.make_batch([block_lm.Example(prompt, reply)], b, sp.mask, sp.pad, sp.eot, torch.Generator())
    # the noisy copy of block 1 (reply positions 4..7): positions 5 and 7 masked, 4 and 6 known
    noisy = list(reply[4:8])
    noisy[1] = noisy[3] = sp.mask
    r0 = block_lm.PROMPT_LEN + block_lm.REPLY_LEN
    batch.ids[0, r0 + 4 : r0 + 8] = torch.tensor(noisy)
    hidden = model.transformer(input_ids=batch.ids, attention_mask=batch.attention,
                               position_ids=batch.positions).last_hidden_state[0]
    want = model.lm_head(hidden[block_lm.predictor_index(b)[4:8]])

    cache = DynamicCache()
    dec._forward(prompt, 0, cache, causal_rows=len(prompt))
    hb = dec._forward(reply[:4] + noisy, len(prompt), cache, causal_rows=4)
    got = model.lm_head(torch.cat([hb[3:4], hb[4:7]]))
    assert torch.allclose(got, want, atol=1e-3), (got - want).abs().max()
    assert cache.get_seq_length() == len(prompt) + 8  # the decoder crops the noisy rows after a pass


def _probs(rows: list[dict[int, float]], vocab: int) -> torch.Tensor:
    p = torch.full((len(rows), vocab), 1e-6)
    for i, r in enumerate(rows):
        for t, v in r.items():
            p[i, t] = v
    return p


def test_commit_rules(parts) -> None:  # noqa: ANN001
    _, tok, dec = parts
    sp, v = tok.special, tok.vocab_size
    opts = BlockOptions(block=4, tau=0.9)
    a, c, d = 100, 101, 102
    # leftmost is taken although unsure; an unsure middle one waits; a confident far one waits
    # too, as it was read with its left neighbour masked (sure_left), unless asked not to
    block: list[int | None] = [None] * 4
    conf = [0.0] * 4
    rows = [{a: 0.3}, {c: 0.5}, {d: 0.95}, {sp.eot: 0.99}]
    dec._commit(block, conf, _probs(rows, v), opts, False, [])
    assert block == [a, None, None, None]
    block = [None] * 4
    dec._commit(block, conf, _probs(rows, v), BlockOptions(block=4, tau=0.9, sure_left=False), False, [])
    assert block == [a, None, d, None]  # the end token at the far side is not taken
    # beside a sure leftmost a confident neighbour joins the pass; beside a guessed one it waits
    # ("Hello" at 0.59 with the "i" of "Hi" at 0.92 read "Helloi")
    block = [None] * 4
    dec._commit(block, conf, _probs([{a: 0.95}, {c: 0.95}, {d: 0.95}, {}], v), opts, False, [])
    assert block == [a, c, d, None]
    block = [None] * 4
    dec._commit(block, conf, _probs([{a: 0.59}, {c: 0.92}, {}, {}], v), opts, False, [])
    assert block == [a, None, None, None]
    # an end token ends the reply only at the leftmost open position
    block = [a, None, None, None]
    dec._commit(block, conf, _probs([{}, {sp.eot: 0.6}, {c: 0.99}, {d: 0.99}], v), opts, False, [])
    assert block == [a, sp.eot, None, None]
    # not before min_tokens reply tokens: the end's runner-up is taken there instead
    block = [a, None, None, None]
    dec._commit(block, conf, _probs([{}, {sp.eot: 0.6, c: 0.3}, {}, {}], v), BlockOptions(block=4, min_tokens=3),
                False, [d])
    assert block[:2] == [a, c]
    block = [a, None, None, None]
    dec._commit(block, conf, _probs([{}, {sp.eot: 0.6, c: 0.3}, {}, {}], v), BlockOptions(block=4, min_tokens=3),
                False, [d, c])
    assert block[:2] == [a, sp.eot]
    # two neighbours never take the same token: the second waits, or takes its second best
    rows = [{a: 0.95}, {a: 0.97, c: 0.02}, {d: 0.5}, {d: 0.4}]
    block = [None] * 4
    dec._commit(block, conf, _probs(rows, v), opts, False, [])
    assert block == [a, None, None, None]
    block = [None] * 4
    dec._commit(block, conf, _probs(rows, v), opts, True, [])
    assert block[:2] == [a, c] and block[2] != block[3]
    # fill_all (deadline or last pass) leaves no position open
    block = [None] * 4
    dec._commit(block, conf, _probs([{a: 0.3}, {c: 0.3}, {d: 0.3}, {a: 0.3}], v), opts, True, [])
    assert None not in block


def test_sampling_draws_the_leftmost_from_its_allowed_nucleus(parts) -> None:  # noqa: ANN001
    _, tok, dec = parts
    v = tok.vocab_size
    a, c, d = 100, 101, 102
    probs = _probs([{a: 0.5, c: 0.4, d: 0.1}, {}, {}, {}], v)
    opts = BlockOptions(block=4, temperature=1.0, top_p=0.85, generator=torch.Generator().manual_seed(7))
    drawn = []
    for said in ([], [a]):
        for _ in range(200):
            block: list[int | None] = [None] * 4
            dec._commit(block, [0.0] * 4, probs, opts, False, said)
            drawn.append((bool(said), block[0]))
    assert {t for s, t in drawn if not s} == {a, c}  # d lies outside the 0.85 nucleus
    assert a not in {t for s, t in drawn if s}  # never the token said right before it
    # a low temperature sharpens the draw toward the best
    cold = BlockOptions(block=4, temperature=0.01, generator=torch.Generator().manual_seed(7))
    for _ in range(50):
        block = [None] * 4
        dec._commit(block, [0.0] * 4, probs, cold, False, [])
        assert block[0] == a


def test_sampled_replies_follow_their_seed(parts) -> None:  # noqa: ANN001
    from llm.responder import reply_generator

    _, tok, dec = parts
    prompts = [tok.prompt_ids(t, 32) for t in ("Thanks, bye.", "Hello?", "Can I book a table?", "Is it raining?")]
    greedy = [dec.generate(p, BlockOptions(max_tokens=16)).ids for p in prompts]
    assert [dec.generate(p, BlockOptions(max_tokens=16, temperature=0.0, generator=torch.Generator())).ids
            for p in prompts] == greedy  # temperature 0 is greedy

    def sampled(seed: int | None) -> list[list[int]]:
        return [dec.generate(p, BlockOptions(max_tokens=16, temperature=1.0,
                                             generator=reply_generator(seed, p))).ids for p in prompts]

    assert sampled(3) == sampled(3)  # a seed and a prompt give one reply
    runs = [sampled(s) for s in (1, 2, 3)] + [sampled(None) for _ in range(2)]
    assert any(r != runs[0] for r in runs[1:])


def test_generate_ends_and_counts_passes(parts) -> None:  # noqa: ANN001
    _, tok, dec = parts
    res = dec.generate(tok.prompt_ids("hello", 32), BlockOptions(block=8, tau=0.9, max_tokens=32))
    assert res.ids and len(res.ids) <= 32
    assert tok.special.mask not in res.ids and tok.special.eot not in res.ids
    assert res.stats.steps == 1 + len(res.stats.tokens_per_step)  # the prompt's pass plus the block passes
    assert len(res.confidence) == len(res.ids)


def test_past_deadline_the_reply_ends_at_a_sentence_end(parts) -> None:  # noqa: ANN001
    model, tok, _ = parts
    from llm.loader import load_lm
    from llm.responder import sentence_end_ids

    sp = tok.special
    ends = sentence_end_ids(load_lm(LlmConfig(model_path=str(AR_WEIGHTS.parent / "bdlm"))))
    assert tok.encode(".")[-1] in ends and tok.encode(" hello")[-1] not in ends
    dec = BlockDiffusionDecoder(model, SpecialTokens(sp.mask, sp.eot, sp.pad, (sp.bos, sp.sep)), ends)
    prompt = tok.prompt_ids("I forgot my password again.", 32)
    full = dec.generate(prompt, BlockOptions(block=8, tau=1.0, max_tokens=32))
    late = dec.generate(prompt, BlockOptions(block=8, tau=1.0, max_tokens=32, deadline=time.perf_counter()))
    assert late.stats.deadline_hit
    assert late.ids == full.ids[: len(late.ids)]  # the same words, cut, never filled in a hurry
    assert late.ended == (late.ids[-1] in ends) and sp.mask not in late.ids
    # with no time to finish a sentence, the reply stops where it is
    rushed = dec.generate(prompt, BlockOptions(block=8, tau=1.0, deadline=time.perf_counter(), overrun_s=0.0))
    assert len(rushed.ids) <= len(late.ids) and len(rushed.stats.tokens_per_step) == 1
    # streamed: a late reply ends at a sentence end after what was handed over, never inside one
    seen: list[list[int]] = []

    def hand_over_at(n: int) -> Callable[[list[int]], bool]:
        def on_pass(known: list[int]) -> bool:
            seen.append(list(known))
            return len(known) >= n
        return on_pass

    opts = BlockOptions(block=8, tau=1.0, max_tokens=32, deadline=time.perf_counter(), overrun_s=0.0)
    streamed = dec.generate(prompt, opts, on_pass=hand_over_at(1))
    first_end = next((i + 1 for i, t in enumerate(full.ids) if t in ends), len(full.ids))
    assert streamed.ids == full.ids[:first_end] and len(seen) == 1 and seen[0] == full.ids[:1]
    three = dec.generate(prompt, opts, on_pass=hand_over_at(first_end + 1))
    assert three.ids[: first_end + 1] == full.ids[: first_end + 1]  # never shorter than what was handed over
    assert three.ids == full.ids or three.ids[-1] in ends
    # before the handover, a late reply still ends at a sentence end, never where it is
    never = dec.generate(prompt, opts, on_pass=lambda known: False)
    assert never.ids == full.ids[: len(never.ids)] and sp.mask not in never.ids
    assert never.ids[-1] in ends or never.ids == full.ids


def test_should_stop_cancels_between_passes(parts) -> None:  # noqa: ANN001
    _, tok, dec = parts
    with pytest.raises(DecodeCancelled):
        dec.generate(tok.prompt_ids("hello", 32), BlockOptions(), should_stop=lambda: True)


def test_no_token_says_a_trigram_again(parts) -> None:  # noqa: ANN001
    _, tok, dec = parts
    v = tok.vocab_size
    go, to, the = 100, 101, 102
    # the reply so far: "to go to go": the next "to" would say "to go to" again
    block: list[int | None] = [None] * 4
    conf = [0.0] * 4
    rows = [{to: 0.9, the: 0.05}, {}, {}, {}]
    dec._commit(block, conf, _probs(rows, v), BlockOptions(block=4), False, [to, go, to, go])
    assert block[0] == the
    dec._commit(block := [None] * 4, conf, _probs(rows, v), BlockOptions(block=4, no_repeat_ngram=0), False,
                [to, go, to, go])
    assert block[0] == to


def test_the_trigram_ban_does_not_break_a_word(parts) -> None:  # noqa: ANN001
    model, tok, _ = parts
    sp = tok.special
    from llm.loader import load_lm
    from llm.responder import sentence_end_ids, word_continuation_ids

    lm = load_lm(LlmConfig())  # the embedded block diffusion LM: the AR baseline's tokenizer
    ends = sentence_end_ids(lm)
    cont = word_continuation_ids(lm, ends)
    ids = tok.encode(" I don't think I don")
    apostrophe_t, think = ids[2], ids[3]
    assert apostrophe_t in cont and think not in cont  # "'t" goes on "don"; " think" starts a word
    dec = BlockDiffusionDecoder(model, SpecialTokens(sp.mask, sp.eot, sp.pad, (sp.bos, sp.sep)), ends, cont)
    rows = [{apostrophe_t: 0.9, sp.eot: 0.05}, {}, {}, {}]
    block: list[int | None] = [None] * 4
    # "I don't" is said already, but banning "'t" here would leave "don" broken
    dec._commit(block, [0.0] * 4, _probs(rows, tok.vocab_size), BlockOptions(block=4), False, ids)
    assert block[0] == apostrophe_t


@torch.no_grad()
def test_guided_batch_reads_each_prompt_as_if_alone(parts) -> None:  # noqa: ANN001
    """Guidance reads the block against the prompt and against ``<bos> <agent>`` in one batch
    of two, the short prompt padded in front: each row must see exactly what it would alone."""
    _, tok, dec = parts
    sp = tok.special
    prompt = tok.prompt_ids("I forgot my password again.", 32)
    bare = [prompt[0], prompt[-1]]
    both = DynamicCache()
    last = dec._guided_prompt(prompt, bare, both)
    block = [sp.mask, tok.encode(" reset")[-1], sp.mask]
    rows = [(len(prompt), 0), (len(bare), len(prompt) - len(bare))]
    batched = dec._forward_rows(block, both, 0, rows)
    for r, p in enumerate((prompt, bare)):
        alone = DynamicCache()
        h = dec._forward(p, 0, alone, causal_rows=len(p))
        assert torch.allclose(last[r], h[-1], atol=1e-4)
        assert torch.allclose(batched[r], dec._forward(block, len(p), alone, causal_rows=0), atol=1e-4)


def test_guidance_changes_replies_only_when_asked(parts) -> None:  # noqa: ANN001
    _, tok, dec = parts
    prompt = tok.prompt_ids("Can I change my booking?", 32)
    bare = [prompt[0], prompt[-1]]
    plain = dec.generate(prompt, BlockOptions())
    assert dec.generate(prompt, BlockOptions(), unprompted=bare).ids == plain.ids  # guidance 0: off
    guided = dec.generate(prompt, BlockOptions(guidance=0.5), unprompted=bare)
    assert guided.ids and tok.special.mask not in guided.ids
    assert guided.stats.steps == 1 + len(guided.stats.tokens_per_step)

"""Block decoder unit tests: scripted logits (FakeLogits) isolate the decoding rules, and a
small randomly initialised ModernBertForMaskedLM checks the batched and warm-start paths
on a real transformers model."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import ModernBertConfig, ModernBertForMaskedLM

from llm.decoder import (
    DecodeCancelled,
    DecodeOptions,
    SpecialTokens,
    generate_block,
    generate_blocks,
    schedule_counts,
)
from llm.loader import LoadedLM
from llm.responder import Responder
from pipelines.config import LlmConfig

torch.set_num_threads(1)

PAD, BOS, SEP, EOT, MASK = 0, 1, 2, 3, 4
SPECIAL = SpecialTokens(mask=MASK, eot=EOT, pad=PAD, forbidden=(BOS, SEP))
VOCAB = 64
WORDS = list(range(5, VOCAB))


class FakeLogits:
    """Scripted denoiser. Block position j prefers ``token(j)`` with probability ``prob(j)``;
    from ``end_from`` on it prefers padding (the reply is over) with ``end_prob``. The rest of
    the mass is spread over the other word tokens. Counts calls and can sleep per call."""

    def __init__(
        self,
        token: object = None,
        prob: object = None,
        end_from: int | None = None,
        end_prob: float = 0.9,
        sleep_s: float = 0.0,
    ) -> None:
        self.token = token or (lambda j: WORDS[j % len(WORDS)])
        self.prob = prob or (lambda j: 0.6)
        self.end_from = end_from
        self.end_prob = end_prob
        self.sleep_s = sleep_s
        self.calls = 0
        self.inputs: list[torch.Tensor] = []

    def __call__(self, ids: torch.Tensor, attn: torch.Tensor, start: int) -> torch.Tensor:
        self.calls += 1
        self.inputs.append(ids.clone())
        if self.sleep_s:
            time.sleep(self.sleep_s)
        b, length = ids.shape[0], ids.shape[1] - start
        probs = torch.zeros((b, length, VOCAB))
        for j in range(length):
            if self.end_from is not None and j >= self.end_from:
                t, p = PAD, self.end_prob
            else:
                t, p = self.token(j), self.prob(j)
            probs[:, j, WORDS] = (1.0 - p) / (len(WORDS) - 1)
            probs[:, j, t] = p
        return probs.clamp_min(1e-9).log()


def tiny_mdlm(seed: int = 0, end_bias: float = 0.0) -> ModernBertForMaskedLM:
    torch.manual_seed(seed)
    cfg = ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
        global_attn_every_n_layers=1,
        local_attention=128,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOT,
        cls_token_id=BOS,
        sep_token_id=SEP,
        mask_token_id=MASK,
        tie_word_embeddings=True,
    )
    model = ModernBertForMaskedLM(cfg).eval()
    with torch.no_grad():
        # the default init gives near-uniform, position-blind outputs, whose near-ties float
        # noise could flip; larger random weights give peaked, position-dependent outputs
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.3)
        model.decoder.bias[PAD] += end_bias  # > 0: some replies end inside the block
    return model


def model_logits(model: ModernBertForMaskedLM):  # noqa: ANN201
    def fn(ids: torch.Tensor, attn: torch.Tensor, start: int) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=attn).logits[:, start:]

    return fn


PROMPTS = [[BOS, 10, 11, 12, SEP], [BOS, 20, SEP], [BOS, 30, 31, 32, 33, 34, 35, SEP], [BOS, 40, 41, SEP]]


# ---- schedule arithmetic -------------------------------------------------------------------


@pytest.mark.parametrize("masked,steps", [(32, 8), (32, 5), (7, 3), (16, 16), (5, 9), (1, 4), (100, 7)])
@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0, 4.0])
def test_schedule_sums_and_commits_every_pass(masked: int, steps: int, gamma: float) -> None:
    counts = schedule_counts(masked, steps, gamma)
    assert sum(counts) == masked
    assert len(counts) == min(steps, masked)
    assert all(c >= 1 for c in counts)


def test_schedule_gamma_one_is_even() -> None:
    assert schedule_counts(32, 8, 1.0) == [4] * 8
    assert schedule_counts(32, 32, 1.0) == [1] * 32


def test_schedule_gamma_above_one_commits_more_early() -> None:
    even = schedule_counts(32, 8, 1.0)
    coarse = schedule_counts(32, 8, 2.0)
    fine = schedule_counts(32, 8, 0.5)
    # cumulative share after pass s is ((s+1)/S)**(1/gamma)
    assert coarse[0] == round(32 * (1 / 8) ** 0.5)
    assert coarse[0] > even[0] > fine[0]
    assert coarse[-1] < even[-1] < fine[-1]
    cum = lambda c: [sum(c[: i + 1]) for i in range(len(c))]  # noqa: E731
    assert all(a >= b for a, b in zip(cum(coarse), cum(even), strict=True))


def test_schedule_zero_masked() -> None:
    assert sum(schedule_counts(0, 4, 1.0)) == 0


def test_tau_commits_best_plus_every_position_over_threshold() -> None:
    # positions 0..7 sure (0.95), the rest unsure (0.3); the schedule alone would take 2 a pass
    fake = FakeLogits(prob=lambda j: 0.95 if j < 8 else 0.3)
    res = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=32, steps=16, tau=0.9))
    # the 2 scheduled picks are the best positions, which are among the 8 over tau
    assert res.stats.tokens_per_step[0] == 8
    no_tau = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=32, steps=16, tau=None))
    assert no_tau.stats.tokens_per_step[0] == 2


def test_adaptive_stop_when_every_position_passes_tau() -> None:
    fake = FakeLogits(prob=lambda j: 0.97)
    res = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=32, steps=32, tau=0.9))
    assert res.stats.steps == 1 and fake.calls == 1
    assert len(res.ids) == 32
    held = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=32, steps=32, tau=0.9, min_steps=4))
    assert held.stats.steps == 4
    assert held.ids == res.ids


def test_tau_one_never_stops_early() -> None:
    fake = FakeLogits(prob=lambda j: 0.97)
    res = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=16, steps=8, tau=1.0))
    assert res.stats.steps == 8
    assert res.stats.tokens_per_step == [2] * 8


def test_gamma_shapes_tokens_per_step() -> None:
    fake = FakeLogits()
    opts = DecodeOptions(block_len=32, steps=8, tau=None, gamma=2.0, no_adjacent_repeat=False)
    res = generate_block(fake, PROMPTS[0], SPECIAL, opts)
    assert res.stats.tokens_per_step == schedule_counts(32, 8, 2.0)


def test_sub_blocks_fill_left_to_right() -> None:
    fake = FakeLogits(prob=lambda j: 0.3 + 0.02 * j)  # later positions look surer
    opts = DecodeOptions(block_len=32, steps=8, tau=None, sub_block=8)
    res = generate_block(fake, PROMPTS[0], SPECIAL, opts)
    assert res.stats.steps == 8
    # the first sub-block gets 8 // 4 = 2 passes; after one pass only it has been touched
    second = fake.inputs[1][0, -32:]
    assert bool((second[8:] == MASK).all())
    assert int((second[:8] != MASK).sum()) == 4


# ---- every position filled, end-of-turn handling ------------------------------------------


@pytest.mark.parametrize("score", ["max_prob", "margin", "entropy"])
@pytest.mark.parametrize(
    "kw",
    [
        {"steps": 4, "tau": None},
        {"steps": 8, "tau": 0.9},
        {"steps": 32, "tau": 0.5, "sub_block": 8},
        {"steps": 6, "tau": None, "gamma": 3.0, "end_rule": "length", "trim_tail": False},
        {"steps": 1, "tau": None},
    ],
)
def test_every_position_gets_filled(score: str, kw: dict) -> None:
    model = tiny_mdlm()
    opts = DecodeOptions(block_len=24, score=score, **kw)  # type: ignore[arg-type]
    for res in generate_blocks(model_logits(model), PROMPTS, SPECIAL, opts):
        assert MASK not in res.block
        assert len(res.block) == 24
        assert not {MASK, BOS, SEP, EOT, PAD} & set(res.ids)
        if res.ended:
            end = res.block.index(EOT)
            assert res.ids == res.block[:end]
            assert all(t == PAD for t in res.block[end + 1 :])
        assert res.stats.steps <= kw["steps"]


def test_end_token_trims_the_reply_and_pads_the_rest() -> None:
    fake = FakeLogits(end_from=6)
    res = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=16, steps=4, tau=None))
    assert res.ended
    assert res.ids == [WORDS[j] for j in range(6)]
    assert res.block[6] == EOT and res.block[7:] == [PAD] * 9


def test_length_rule_also_ends_and_trims() -> None:
    fake = FakeLogits(end_from=6)
    opts = DecodeOptions(block_len=16, steps=16, tau=None, end_rule="length")
    res = generate_block(fake, PROMPTS[0], SPECIAL, opts)
    assert res.ended and res.ids == [WORDS[j] for j in range(6)]


def test_rank_rule_settles_words_before_the_end() -> None:
    # the end is surer (0.9) than any word (0.6), yet words are committed first
    fake = FakeLogits(end_from=6)
    res = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=16, steps=16, tau=None))
    assert fake.inputs[1][0, -16:].tolist().count(EOT) == 0
    assert res.ended and res.ids == [WORDS[j] for j in range(6)]


def test_length_rule_fixes_the_length_on_the_first_pass() -> None:
    fake = FakeLogits(end_from=10, end_prob=0.6)
    res = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=32, steps=8, tau=None, end_rule="length"))
    assert len(res.ids) == 10 and res.ended
    # the end token was committed in the first pass: later passes only see masks before it
    assert fake.inputs[1][0, 5 + 10] == EOT


def test_a_reply_that_ends_in_the_first_sub_block_gets_every_pass() -> None:
    class FakeLateEnd(FakeLogits):
        """Unsure where the reply ends on the first pass, sure from the second."""

        def __call__(self, ids: torch.Tensor, attn: torch.Tensor, start: int) -> torch.Tensor:
            self.end_prob = 0.3 if self.calls == 0 else 0.9
            return super().__call__(ids, attn, start)

    fake = FakeLateEnd(end_from=10)
    opts = DecodeOptions(block_len=32, steps=8, tau=None, sub_block=16, end_rule="length")
    res = generate_block(fake, PROMPTS[0], SPECIAL, opts)
    assert len(res.ids) == 10 and res.ended
    # planned 4 passes for sub-block 0 of 2; once the end fixed one sub-block, it got the rest
    assert res.stats.steps == 7
    assert res.stats.tokens_per_step[0] == 4


def test_trim_tail_leaves_the_padding_out_of_later_passes() -> None:
    fake = FakeLogits(end_from=10, end_prob=0.6)
    opts = DecodeOptions(block_len=32, steps=4, tau=None, trim_tail=True, end_rule="length")
    res = generate_block(fake, PROMPTS[0], SPECIAL, opts)
    assert len(res.ids) == 10 and res.block[10] == EOT and MASK not in res.block
    assert [x.shape[1] for x in fake.inputs] == [5 + 32, 5 + 11, 5 + 11, 5 + 11]


def test_min_len_keeps_an_early_end_away() -> None:
    fake = FakeLogits(end_from=0)
    res = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=16, steps=4, tau=None, min_len=3))
    assert len(res.ids) == 3 and res.ended


def test_block_without_end_token_is_not_ended() -> None:
    res = generate_block(FakeLogits(), PROMPTS[0], SPECIAL, DecodeOptions(block_len=12, steps=3, tau=None))
    assert not res.ended and len(res.ids) == 12


def test_no_adjacent_repeat_breaks_runs_of_one_token() -> None:
    same = FakeLogits(token=lambda j: 7, prob=lambda j: 0.5)
    opts = DecodeOptions(block_len=16, steps=4, tau=None)
    res = generate_block(same, PROMPTS[0], SPECIAL, opts)
    assert all(a != b for a, b in zip(res.ids, res.ids[1:], strict=False))
    plain = generate_block(
        same, PROMPTS[0], SPECIAL, DecodeOptions(block_len=16, steps=4, tau=None, no_adjacent_repeat=False)
    )
    assert plain.ids == [7] * 16


def test_invalid_options_raise() -> None:
    for kw in (
        {"steps": 0},
        {"tau": 0.0},
        {"tau": 1.5},
        {"gamma": 0.0},
        {"min_steps": 9, "steps": 8},
        {"score": "best"},
        {"end_rule": "never"},
        {"min_len": 99},
    ):
        with pytest.raises(ValueError):
            DecodeOptions(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        generate_block(FakeLogits(), [], SPECIAL, DecodeOptions())
    with pytest.raises(ValueError):
        generate_block(FakeLogits(), PROMPTS[0], SPECIAL, DecodeOptions(block_len=8), init_block=[5] * 7)


# ---- deadline, cancellation ----------------------------------------------------------------


def test_deadline_returns_on_time_with_no_masks_left() -> None:
    fake = FakeLogits(prob=lambda j: 0.3, sleep_s=0.02)
    budget = 0.1
    t0 = time.perf_counter()
    res = generate_block(
        fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=32, steps=32, tau=None, deadline=t0 + budget)
    )
    elapsed = time.perf_counter() - t0
    assert res.stats.deadline_hit
    assert MASK not in res.block and len(res.ids) == 32
    assert res.stats.steps < 32
    # the final pass reuses the last logits: no pass starts that cannot end by the deadline
    assert elapsed <= budget + 0.015, elapsed


def test_deadline_on_a_real_model_fills_the_block() -> None:
    model = tiny_mdlm()
    fn = model_logits(model)
    fn(torch.tensor([PROMPTS[0] + [MASK] * 32]), torch.ones((1, 37), dtype=torch.long), 5)  # warm-up
    # a deadline already past still gets one pass: the anytime decoder always answers
    res = generate_block(
        fn, PROMPTS[0], SPECIAL, DecodeOptions(block_len=32, steps=32, tau=None, deadline=time.perf_counter())
    )
    assert MASK not in res.block
    assert res.stats.steps == 1 and res.stats.deadline_hit


def test_generous_deadline_is_not_hit() -> None:
    res = generate_block(
        FakeLogits(),
        PROMPTS[0],
        SPECIAL,
        DecodeOptions(block_len=8, steps=4, tau=None, deadline=time.perf_counter() + 30),
    )
    assert not res.stats.deadline_hit and res.stats.steps == 4


def test_should_stop_cancels_between_passes() -> None:
    fake = FakeLogits(prob=lambda j: 0.3)
    asked = 0

    def stop() -> bool:
        nonlocal asked
        asked += 1
        return asked > 2

    with pytest.raises(DecodeCancelled):
        generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=32, steps=16, tau=None), should_stop=stop)
    assert fake.calls == 2


async def test_agenerate_cancellation_stops_the_worker() -> None:
    fake = FakeLogits(prob=lambda j: 0.3, sleep_s=0.02)
    lm = LoadedLM(
        "masked_lm",
        torch.nn.Identity(),
        fake,
        SPECIAL,
        lambda text, hist, n: PROMPTS[0],
        lambda ids: " ".join(map(str, ids)),
        Path("."),
    )
    responder = Responder(lm, LlmConfig(steps=64, min_steps=1, block_len=64, sub_block=64))
    task = asyncio.create_task(responder.agenerate("hello"))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    calls = fake.calls
    await asyncio.sleep(0.15)
    assert 0 < calls < 64
    assert fake.calls <= calls + 1  # at most the pass in flight finished


# ---- warm start and batching ---------------------------------------------------------------


def test_warm_start_keeps_unmasked_tokens() -> None:
    model = tiny_mdlm()
    init = [WORDS[j] for j in range(10)] + [EOT] + [PAD] * 13
    remask = [j in (2, 3, 7) for j in range(24)]
    fn = model_logits(model)
    res = generate_block(
        fn, PROMPTS[1], SPECIAL, DecodeOptions(block_len=24, steps=4, tau=None), init_block=init, remask=remask
    )
    for j in range(24):
        if not remask[j]:
            assert res.block[j] == init[j], j
    assert MASK not in res.block and res.ended and len(res.ids) == 10
    assert res.stats.steps <= 3  # only three positions were left to decode


def test_warm_start_remasked_end_reopens_the_tail() -> None:
    init = [WORDS[j] for j in range(4)] + [EOT] + [PAD] * 11
    remask = [j >= 4 for j in range(16)]
    res = generate_block(
        FakeLogits(end_from=8),
        PROMPTS[0],
        SPECIAL,
        DecodeOptions(block_len=16, steps=4, tau=None),
        init_block=init,
        remask=remask,
    )
    assert res.ids[:4] == init[:4] and len(res.ids) == 8


def test_warm_start_with_nothing_remasked_costs_no_pass() -> None:
    fake = FakeLogits()
    init = [WORDS[j] for j in range(8)]
    res = generate_block(fake, PROMPTS[0], SPECIAL, DecodeOptions(block_len=8), init_block=init, remask=[False] * 8)
    assert res.ids == init and fake.calls == 0


@pytest.mark.parametrize(
    "kw",
    [
        {"steps": 8, "tau": None},
        {"steps": 8, "tau": None, "trim_tail": False},
        {"steps": 16, "tau": 0.2, "sub_block": 8},
        {"steps": 5, "tau": None, "end_rule": "length", "score": "margin"},
        {"steps": 12, "tau": None, "end_rule": "length", "score": "entropy", "min_len": 0},
    ],
)
def test_batched_output_equals_per_call_output(kw: dict) -> None:
    model = tiny_mdlm(seed=3, end_bias=2.0)
    fn = model_logits(model)
    opts = DecodeOptions(block_len=16, **kw)  # type: ignore[arg-type]
    batched = generate_blocks(fn, PROMPTS, SPECIAL, opts)
    # rows that end at different places (or not at all) share the batch
    assert 1 <= sum(b.ended for b in batched) < len(batched) or len({len(b.ids) for b in batched}) > 1
    for prompt, b in zip(PROMPTS, batched, strict=True):
        single = generate_block(fn, prompt, SPECIAL, opts)
        assert single.block == b.block
        assert single.stats.steps == b.stats.steps
        assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(single.confidence, b.confidence, strict=True))


def test_batch_rows_finish_independently() -> None:
    fake = FakeLogits(prob=lambda j: 0.3)
    res = generate_blocks(
        fake,
        PROMPTS[:2],
        SPECIAL,
        DecodeOptions(block_len=8, steps=4, tau=None),
        init_blocks=[[MASK] * 8, WORDS[10:17] + [MASK]],
        remask=[[False] * 8, [False] * 8],
    )
    assert [r.stats.steps for r in res] == [4, 1]
    # a finished row leaves the batch: later passes run the model on the other row only
    assert [x.shape[0] for x in fake.inputs] == [2, 1, 1, 1]


def test_concurrent_threads_decode_the_same() -> None:
    model = tiny_mdlm(seed=5)
    fn = model_logits(model)
    opts = DecodeOptions(block_len=16, steps=4, tau=None)
    ref = generate_block(fn, PROMPTS[2], SPECIAL, opts).block
    out: list[list[int]] = []
    threads = [
        threading.Thread(target=lambda: out.append(generate_block(fn, PROMPTS[2], SPECIAL, opts).block))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [ref] * 3


def fake_responder(fake: FakeLogits, **cfg: object) -> Responder:
    lm = LoadedLM("masked_lm", torch.nn.Identity(), fake, SPECIAL, lambda text, hist, n: PROMPTS[0],
                  lambda ids: " ".join(map(str, ids)), Path("."))
    return Responder(lm, LlmConfig(**cfg))  # type: ignore[arg-type]


def test_redenoise_redecodes_only_positions_that_changed() -> None:
    fake = FakeLogits(prob=lambda j: 0.9, end_from=12)
    responder = fake_responder(fake, steps=4, tau=0.95, block_len=32, sub_block=32)
    prev = responder.generate("hello")
    assert len(prev.ids) == 12
    calls = fake.calls
    same = responder.redenoise(prev, "hello")
    assert same.remasked == 0 and same.block == prev.block
    assert fake.calls == calls + 1  # the scoring pass only
    fake.token = lambda j: 50 if j == 3 else WORDS[j % len(WORDS)]  # the new prompt changes one word
    changed = responder.redenoise(prev, "hello there")
    assert changed.remasked == 1
    assert changed.ids[3] == 50 and changed.ids[:3] == prev.ids[:3] and changed.ids[4:] == prev.ids[4:]


def test_redenoise_lets_the_reply_grow_when_its_end_moves() -> None:
    fake = FakeLogits(prob=lambda j: 0.9, end_from=12)
    responder = fake_responder(fake, steps=4, tau=0.95, block_len=32, sub_block=32)
    prev = responder.generate("hello")
    fake.end_from = 16
    longer = responder.redenoise(prev, "hello, and one more thing")
    assert longer.ids[:12] == prev.ids and len(longer.ids) == 16 and longer.remasked == 20

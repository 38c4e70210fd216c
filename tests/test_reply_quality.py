"""The embedded LM's replies, judged by link-grammar (a judge nobody here wrote), on a fixed
held-out sample of caller utterances (``bench/data/caller_test.txt``, never trained on), at
the default config. The bounds sit below what `bench/reply_quality.py` measures on the whole
test split; they catch a model or decoder that writes broken or stuttering English."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llm.grammar_judge import LinkGrammarJudge
from llm.quality import repeats
from llm.responder import Responder
from pipelines.config import LlmConfig

SAMPLE = Path(__file__).resolve().parents[1] / "bench" / "data" / "caller_test.txt"
N = 40


@pytest.fixture(scope="module")
def replies() -> list[tuple[str, str]]:
    torch.set_num_threads(1)
    lines = [ln.strip() for ln in SAMPLE.read_text().splitlines() if ln.strip()]
    prompts = lines[:: max(1, len(lines) // N)][:N]
    r = Responder.load(LlmConfig())
    return [(p, r.generate(p).text) for p in prompts]


def test_replies_are_grammatical_english(replies: list[tuple[str, str]]) -> None:
    judge = LinkGrammarJudge()
    bad = [(p, r) for p, r in replies if not judge.grammatical(r)]
    assert len(bad) <= 0.2 * len(replies), bad


def test_replies_do_not_stutter_and_differ(replies: list[tuple[str, str]]) -> None:
    stutters = [(p, r) for p, r in replies if repeats(r)]
    assert len(stutters) <= 1, stutters
    assert len({r.lower() for _, r in replies}) >= 0.6 * len(replies)
    assert all(r.strip() for _, r in replies)


def test_the_bench_splits_are_in_the_repo_and_never_trained_on() -> None:
    """bench/reply_quality.py scores the same lines in any clone: its SGD turns are committed
    (bench/data/sgd_heldout.jsonl.gz), and no line of either split is a training prompt."""
    import sys

    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import reply_quality as rq
    finally:
        sys.path.remove(str(bench))
    from llm.data import sgd_pairs

    trained = {rq._norm(p.prompt) for p in sgd_pairs()}
    for split, n, sgd in (("dev", 166, 70), ("test", 214, 58)):
        lines = rq.held_out(split)
        assert len(lines) == n, split
        assert sum(u.reference is not None for u in lines) == sgd, split  # SGD turns, with SGD's reply
        assert not {rq._norm(u.text) for u in lines} & trained, split

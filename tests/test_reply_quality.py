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

"""Final transcripts of real recorded calls (the evaluation set's dev split, bench/eval_calls.py):
each caller turn is written once, and close to what was said.

Whisper on a short padded window can say a short turn twice ("Your temporary greeting has been
removed. Your temporary greeting has been removed.", "November. November"). These are the three
dev calls where the 3 s windows once did that; the hypotheses a turn's answer waits on now take
8 s windows (`asr.min_window_s`, docs/asr.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipelines.replay import replay_pcm
from tests.wer import wer, words
from voice.audio import read_wav

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from eval_calls import load_calls  # noqa: E402


def said_twice(text: str) -> bool:
    """A run of words followed at once by the same run ("november november", "go forward go forward")."""
    w = words(text)
    return any(w[i : i + n] == w[i + n : i + 2 * n]
               for n in range(1, len(w) // 2 + 1) for i in range(len(w) - 2 * n + 1))


def test_said_twice_finds_a_doubled_run_of_words() -> None:
    assert said_twice("November. November") and said_twice("go forward 10 meters. Go forward 10 meters.")
    assert not said_twice("Your temporary greeting has been removed.") and not said_twice("")


@pytest.mark.slow
@pytest.mark.parametrize("call_id", ["dev-011", "dev-013", "dev-020"])
async def test_each_turn_is_transcribed_once(agent, call_id: str) -> None:
    (call,) = [c for c in load_calls("dev") if c["id"] == call_id]
    pcm, rate = read_wav(call["wav"])
    report, _ = await replay_pcm(agent, pcm, rate, fast=True)
    said = [t["transcript"] for t in report["turns"]]
    truth = [t["text"] for t in call["truth"]["turns"]]
    assert len(said) == len(truth), (said, truth)
    for heard, text in zip(said, truth, strict=True):
        assert not said_twice(heard) or said_twice(text), (heard, text)
    assert wer(" ".join(truth), " ".join(said)) <= 0.4, said  # tiny.en: "back kick" for "backtick"

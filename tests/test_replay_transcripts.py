"""Final transcripts of real recorded calls (the evaluation set's dev split, bench/eval_calls.py):
each caller turn is written once, and close to what was said.

Whisper on a short padded window can say a short turn twice ("Your temporary greeting has been
removed. Your temporary greeting has been removed.", "November. November"). These are the three
dev calls where that reached the final transcript; a text said twice over is now decoded again
on an 8 s window (`asr.twice_window_s`, docs/asr.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipelines.replay import replay_pcm
from tests.wer import wer
from voice.asr import said_twice
from voice.audio import read_wav

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from eval_calls import load_calls  # noqa: E402


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


@pytest.mark.slow
@pytest.mark.parametrize(("call_id", "turn"), [("dev-012", 2), ("dev-014", 2)])
async def test_a_long_turn_with_a_pause_is_transcribed_whole(agent, call_id: str, turn: int) -> None:
    """A turn of 3-8 s with a pause inside: Whisper hears it as one utterance. Cut at its
    pause and the rest transcribed alone, it lost its context ("Call for reading, after the
    tone say your name. and then ...", "You haven't turned too many in valid. Personal
    Identification Numbers"; `asr.segment_after_s`, docs/asr.md)."""
    (call,) = [c for c in load_calls("dev") if c["id"] == call_id]
    text = call["truth"]["turns"][turn]["text"]
    pcm, rate = read_wav(call["wav"])
    report, _ = await replay_pcm(agent, pcm, rate, fast=True)
    best = min((t["transcript"] for t in report["turns"]), key=lambda said: wer(text, said))
    assert wer(text, best) <= 0.1, (text, best)

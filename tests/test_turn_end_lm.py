"""The turn-end LM (`llm.turn_end_lm`): its recipe, run briefly (80 steps from the AR
baseline's weights, about a minute), gives a reader that tells whole turns from cut ones on
prompts it never saw, reads words rather than punctuation, and serves as the LM's end-of-turn
opinion when `llm.turn_end_model_path` names it; a missing or broken one is an error naming
the key."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from llm.config import LlmConfig
from llm.loader import ModelLoadError
from llm.turn_end import auc, examples, length_matched
from llm.turn_end_lm import CALIBRATION_FILE, TurnEndLM, main

pytestmark = pytest.mark.skipif(not (Path(__file__).parents[1] / "llm/weights/ar/model.safetensors").exists(),
                                reason="the recipe starts from the AR baseline's weights (llm/weights/ar)")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("chitchat_dataset", reason="its utterances come from chitchat-dataset (extra 'train')")
    out = tmp_path_factory.mktemp("turn_end_lm")
    threads = torch.get_num_threads()
    try:
        assert main(["--steps", "80", "--threads", "2", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    return out


def test_the_recipe_tells_whole_turns_from_cut_ones_on_prompts_it_never_saw(trained: Path) -> None:
    from llm.data import all_pairs, split_pairs

    meta = json.loads((trained / CALIBRATION_FILE).read_text())
    assert meta["steps"] == 80 and meta["heldout_utterances"] > 1000
    lm = TurnEndLM.load(trained)
    _, held = split_pairs(all_pairs(1234), 300, 1234)  # llm.train's held-out split: never trained on
    prompts = [p.prompt for p in held[:150]]
    texts, labels = examples(prompts, random.Random(7))
    probs = lm.probs(texts)
    assert all(0.0 <= p <= 1.0 for p in probs)
    assert auc(probs, labels) >= 0.75
    texts, labels = length_matched(prompts, random.Random(7))  # the word count no help
    assert auc(lm.probs(texts), labels) >= 0.72
    whole = lm.probs(["I want to book a table for two", "can I speak to a real person"])
    cut = lm.probs(["I would like", "my name is", "I want to book a table for"])
    assert min(whole) > max(cut), (whole, cut)
    assert lm.prob("I was wondering if you could.") == pytest.approx(lm.prob("I was wondering if you could"), abs=1e-6)
    # a batch reads each text as it reads it alone (left padding is masked)
    batch = ["yes", "I would like to book a table for two at"]
    assert lm.probs(batch) == pytest.approx([lm.prob(t) for t in batch], abs=1e-4)


def test_the_responder_takes_its_opinion_from_it(trained: Path) -> None:
    from llm.responder import Responder

    r = Responder.load(LlmConfig(turn_end_model_path=str(trained)))
    assert isinstance(r.turn_end, TurnEndLM)
    assert r.turn_end_prob("I would like") == pytest.approx(r.turn_end.prob("I would like"))


def test_a_remote_reply_model_takes_its_opinion_from_it_too(trained: Path) -> None:
    from llm.remote import RemoteResponder

    cfg = LlmConfig(backend="openai", turn_end_model_path=str(trained),
                    openai={"base_url": "http://127.0.0.1:9/v1", "model": "m", "local_turn_end": True})
    r = RemoteResponder.load(cfg)  # nothing is sent: loading reads no server
    assert isinstance(r.turn_end, TurnEndLM)
    assert r.turn_end_prob("I would like") == pytest.approx(r.turn_end.prob("I would like"))


def test_a_missing_or_broken_one_names_the_key(tmp_path: Path) -> None:
    from llm.responder import Responder

    with pytest.raises(ModelLoadError, match="turn_end_model_path"):
        Responder.load(LlmConfig(turn_end_model_path=str(tmp_path / "none")))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / CALIBRATION_FILE).write_text("{}")
    with pytest.raises(ModelLoadError, match="turn_end_model_path.*broken"):
        Responder.load(LlmConfig(turn_end_model_path=str(tmp_path / "broken")))

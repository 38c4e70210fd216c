"""Training smoke run: a few optimizer steps of each model on the real corpus, saved and
loaded back. CI never trains the embedded weights; this checks that the script still can."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llm.loader import EMBEDDED, load_lm
from pipelines.config import LlmConfig

pytest.importorskip("chitchat_dataset", reason="training data comes from chitchat-dataset (extra 'train')")


@pytest.mark.parametrize(("arch", "bf16"), [("mdlm", True), ("ar", False), ("bdlm", True)])
def test_a_few_steps_train_save_and_load(tmp_path: Path, arch: str, bf16: bool) -> None:
    from llm.train import main

    out = tmp_path / arch
    # the BDLM as its stages train: from the embedded weights, SGD, parsing replies only; and
    # the small talk (about 55k pairs of the ~107k left) capped
    extra = ["--init", str(EMBEDDED), "--sgd", "--grammatical", "--chitchat-keep", "1000"] if arch == "bdlm" else []
    argv = ["--arch", arch, "--out", str(out), "--tokenizer", str(EMBEDDED), "--max-steps", "3",
            "--batch", "4", "--minutes", "1"] + (["--bf16"] if bf16 else []) + extra
    main(argv)
    meta = json.loads((out / "train_meta.json").read_text())
    assert meta["steps"] == 3 and meta["bf16_autocast"] is bf16
    assert all(torch.isfinite(torch.tensor(meta["loss_curve"])))
    if arch == "bdlm":
        assert meta["chitchat_keep"] == 1000 and meta["train_pairs"] < 60_000, meta["train_pairs"]
    if arch in ("mdlm", "bdlm"):
        lm = load_lm(LlmConfig(model_path=str(out)))  # the saved directory is a loadable checkpoint
        assert lm.kind == ("masked_lm" if arch == "mdlm" else "bdlm")
    else:
        from llm.ar import ArLM

        ar = ArLM.load(out)
        assert ar.generate(ar.prompt_ids("hello"), 4).steps >= 1

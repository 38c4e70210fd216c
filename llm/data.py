"""Dialogue pairs for training and evaluation, from registry packages.

Sources (licences recorded in the README):
- ``chitchat-dataset`` 0.9.0 (MIT): BYU PCC open-domain chats;
- ``chatterbot-corpus`` 1.3.3 (BSD): English question/answer lists;
- ``llm/corpus/sgd_pairs.jsonl.gz``: caller -> assistant pairs from the Schema-Guided
  Dialogue corpus (CC BY-SA 4.0, ``llm/corpus/SGD-LICENSE.txt``; made by
  ``scripts/extract_sgd.py``);
- a generated persona slice (``llm.persona``) for phone-call behaviour.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import random
import re
from pathlib import Path

from llm.pair import Pair
from llm.persona import persona_pairs

_WS = re.compile(r"\s+")


def _clean(text: str) -> str:
    text = _WS.sub(" ", text).strip()
    return text


def _join_messages(msgs: list[dict]) -> str:
    parts = []
    for m in msgs:
        t = _clean(str(m.get("text", "")))
        if not t:
            continue
        if parts and t[0].isalnum() and parts[-1][-1] not in ".?!,":
            parts[-1] += "."
        parts.append(t)
    return " ".join(parts)


def chitchat_pairs() -> list[Pair]:
    import chitchat_dataset

    path = os.path.join(os.path.dirname(chitchat_dataset.__file__), "dataset.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out: list[Pair] = []
    for convo_id in sorted(data):
        turns = [_join_messages(block) for block in data[convo_id]["messages"]]
        turns = [t for t in turns if t]
        for a, b in zip(turns, turns[1:], strict=False):
            out.append(Pair(a, b, "chitchat"))
    return out


def chatterbot_pairs() -> list[Pair]:
    import chatterbot_corpus
    import yaml

    root = os.path.join(os.path.dirname(chatterbot_corpus.__file__), "data", "english")
    out: list[Pair] = []
    for path in sorted(glob.glob(os.path.join(root, "*.yml"))):
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        for convo in doc.get("conversations", []):
            texts = [_clean(str(t)) for t in convo if str(t).strip()]
            if len(texts) < 2:
                continue
            # the corpus lists alternative answers to the first line
            for answer in texts[1:]:
                out.append(Pair(texts[0], answer, "chatterbot"))
    return out


SGD_PAIRS = Path(__file__).parent / "corpus" / "sgd_pairs.jsonl.gz"
GRAMMATICAL_REPLIES = Path(__file__).parent / "corpus" / "grammatical_replies.txt.gz"
DISTILLED_REPLIES = Path(__file__).parent / "corpus" / "distilled_replies.jsonl.gz"


def sgd_pairs(path: Path = SGD_PAIRS, context_free: bool = False) -> list[Pair]:
    """All SGD pairs; with ``context_free`` only a dialogue's opening request and its closing,
    whose replies need no earlier turn (a reply model that sees no history learns "Yes." ->
    "Your reservation is confirmed." from the rest)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [
            Pair(_clean(d["prompt"]), _clean(d["response"]), "sgd")
            for d in map(json.loads, f)
            if not context_free or d.get("at") in ("first", "last")
        ]


def reply_key(text: str) -> str:
    return hashlib.sha1(_clean(text).encode()).hexdigest()[:12]


def grammatical_replies(path: Path = GRAMMATICAL_REPLIES) -> set[str]:
    """`reply_key`s of the replies that parse and do not stutter (scripts/filter_replies.py)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return {ln.strip() for ln in f if ln.strip()}


def distilled_replies(path: Path = DISTILLED_REPLIES) -> dict[str, str]:
    """The reply model's own filtered replies, by the `reply_key` of their prompt
    (scripts/distill_replies.py)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return {d["k"]: d["reply"] for d in map(json.loads, f)}


def all_pairs(seed: int = 0) -> list[Pair]:
    """The corpora the held-out split is drawn from (`split_pairs`); SGD pairs are added to
    the training side only (``llm.train --sgd``), so that split never moves."""
    return chitchat_pairs() + chatterbot_pairs() + persona_pairs(seed)


def split_pairs(pairs: list[Pair], heldout: int, seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """Deterministic train / held-out split. Held-out prompts never appear in training."""
    rng = random.Random(seed)
    idx = list(range(len(pairs)))
    rng.shuffle(idx)
    held_prompts: set[str] = set()
    held: list[Pair] = []
    for i in idx:
        p = pairs[i]
        if p.source == "chitchat" and len(held) < heldout and 3 <= len(p.response.split()) <= 20:
            held.append(p)
            held_prompts.add(p.prompt)
    train = [p for p in pairs if p.prompt not in held_prompts]
    return train, held

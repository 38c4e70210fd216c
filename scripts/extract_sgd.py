"""Copy the caller -> assistant pairs that training uses out of the Schema-Guided Dialogue
corpus (CC BY-SA 4.0, ../shared/data/sgd-dialogues.jsonl.gz) into llm/corpus/, and the held-out
caller turns that bench/reply_quality.py scores into bench/data/, so a clean clone can retrain
and measure without the shared folder.

    python scripts/extract_sgd.py [--src PATH]

Kept: pairs of a user turn and the system turn that answers it, from SGD's train split only,
where the reply has no digits (times, prices and phone numbers the embedded model would
only invent) and at most 24 words. Output: one JSON object per line, {"prompt", "response",
"at"}: ``at`` is where in its dialogue the pair stands, "first" (the caller's opening
request), "last" (the caller's closing and the goodbye) or "middle" (a reply that answers
what the assistant had asked before, such as "Yes." -> "Your reservation is confirmed.");
a pair found at several places takes the first of first, last, middle.

Held out (``bench/data/sgd_heldout.jsonl.gz``): from SGD's dev and test splits, never trained
on, every user turn with the system turn that answered it where that reply has no digits,
shuffled (seed 1234) and the first 100 of each split kept, in that order: {"split", "prompt",
"reference"}.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SRC = ROOT.parent / "shared" / "data" / "sgd-dialogues.jsonl.gz"
OUT = ROOT / "llm" / "corpus" / "sgd_pairs.jsonl.gz"
_DIGIT = re.compile(r"\d")
_PLACES = ("first", "last", "middle")
HELD_OUT = ROOT / "bench" / "data" / "sgd_heldout.jsonl.gz"
HELD_OUT_PER_SPLIT = 100
HELD_OUT_SEED = 1234


def held_out(src: Path, split: str) -> list[dict[str, str]]:
    """The caller turns of SGD's ``split`` that bench/reply_quality.py scores, in its order."""
    cands: list[dict[str, str]] = []
    with gzip.open(src, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d["split"] != split:
                continue
            turns = d["turns"]
            for a, b in zip(turns, turns[1:], strict=False):
                if a["speaker"] == "user" and b["speaker"] == "system" and not _DIGIT.search(b["text"]):
                    cands.append({"split": split, "prompt": a["text"].strip(), "reference": b["text"].strip()})
    random.Random(HELD_OUT_SEED).shuffle(cands)
    return cands[:HELD_OUT_PER_SPLIT]


def write_jsonl_gz(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as gz:
        gz.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC)
    args = ap.parse_args()
    rows: dict[tuple[str, str], dict[str, str]] = {}
    with gzip.open(args.src, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            if d["split"] != "train":
                continue
            turns = d["turns"]
            for i, (a, b) in enumerate(zip(turns, turns[1:], strict=False)):
                if a["speaker"] != "user" or b["speaker"] != "system":
                    continue
                reply = b["text"].strip()
                if _DIGIT.search(reply) or not 1 <= len(reply.split()) <= 24:
                    continue
                key = (a["text"].strip(), reply)
                at = "first" if i == 0 else "last" if i + 2 == len(turns) else "middle"
                row = rows.setdefault(key, {"prompt": key[0], "response": reply, "at": at})
                if _PLACES.index(at) < _PLACES.index(row["at"]):
                    row["at"] = at
    write_jsonl_gz(OUT, list(rows.values()))
    print(f"{len(rows)} pairs -> {OUT.relative_to(ROOT)}")
    held = held_out(args.src, "dev") + held_out(args.src, "test")
    write_jsonl_gz(HELD_OUT, held)
    print(f"{len(held)} held-out caller turns -> {HELD_OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""Copy the caller -> assistant pairs that training uses out of the Schema-Guided Dialogue
corpus (CC BY-SA 4.0, ../shared/data/sgd-dialogues.jsonl.gz) into llm/corpus/, so a clean
clone can retrain without the shared folder.

    python scripts/extract_sgd.py [--src PATH]

Kept: pairs of a user turn and the system turn that answers it, from SGD's train split only,
where the reply has no digits (times, prices and phone numbers the embedded model would
only invent) and at most 24 words. Output: one JSON object per line, {"prompt", "response",
"at"}: ``at`` is where in its dialogue the pair stands, "first" (the caller's opening
request), "last" (the caller's closing and the goodbye) or "middle" (a reply that answers
what the assistant had asked before, such as "Yes." -> "Your reservation is confirmed.");
a pair found at several places takes the first of first, last, middle.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SRC = ROOT.parent / "shared" / "data" / "sgd-dialogues.jsonl.gz"
OUT = ROOT / "llm" / "corpus" / "sgd_pairs.jsonl.gz"
_DIGIT = re.compile(r"\d")
_PLACES = ("first", "last", "middle")


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
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(OUT, "wb", mtime=0) as gz:
        gz.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows.values()).encode())
    print(f"{len(rows)} pairs -> {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

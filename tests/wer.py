"""Word error rate, for asserting ASR quality against reference transcripts."""

from __future__ import annotations

import re

_NUM = {"mr": "mister", "mrs": "missus", "dr": "doctor"}
# Whisper writes small numbers as digits or as words, depending on the window it saw; scoring
# normalises them (as Whisper's own English normaliser does, in the other direction)
_DIGITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
          "seventeen eighteen nineteen twenty".split()
_NUM.update({str(i): w for i, w in enumerate(_DIGITS)})


def words(text: str) -> list[str]:
    out = []
    for w in re.findall(r"[a-z0-9']+", text.lower().replace("-", " ")):
        out.append(_NUM.get(w, w))
    return out


def wer(ref: str, hyp: str) -> float:
    r, h = words(ref), words(hyp)
    d = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(h) + 1):
            cur = min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
            prev, d[j] = d[j], cur
    return d[len(h)] / max(1, len(r))

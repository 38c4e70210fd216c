"""Build examples/call.wav: a multi-turn call from public-domain recordings (LibriVox clips
from the pocketsphinx sdist, and JFK's 1961 inaugural address from the pywhispercpp sdist),
with long silences between the caller's turns. Run scripts/fetch_speech.py first."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.speech import jfk, librivox  # noqa: E402
from voice.audio import read_wav, write_wav  # noqa: E402

RATE = 16000


def build() -> np.ndarray:
    clips = librivox()
    parts = [
        (1.0, clips[1].path),  # "he was not an ill disposed young man"
        (4.0, clips[4].path),  # "he might even have been made amiable himself"
        (4.0, jfk().path),  # "and so my fellow americans ..."
    ]
    out = []
    for lead, path in parts:
        out.append(np.zeros(int(lead * RATE), dtype=np.int16))
        pcm, _ = read_wav(path, RATE)
        out.append(pcm)
    out.append(np.zeros(int(3.0 * RATE), dtype=np.int16))
    return np.concatenate(out)


if __name__ == "__main__":
    dest = Path(__file__).with_name("call.wav")
    write_wav(dest, build(), RATE)
    print(f"wrote {dest}")

"""Paths to the real recorded speech fetched by scripts/fetch_speech.py, with transcripts."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("VOICE_AGENT_SPEECH", Path.home() / ".cache" / "voice-agent" / "speech"))


@dataclass(frozen=True)
class Clip:
    path: Path
    text: str  # reference transcript, lower case, no punctuation


def _need(p: Path) -> Path:
    if not p.exists():
        pytest.fail(f"missing test speech {p}: run scripts/fetch_speech.py (make setup)")
    return p


def jfk() -> Clip:
    return Clip(
        _need(CACHE / "pywhispercpp/whisper.cpp/samples/jfk.wav"),
        "and so my fellow americans ask not what your country can do for you ask what you can do for your country",
    )


def _transcribed(folder: str, listing: str) -> list[Clip]:
    """Clips listed in a pocketsphinx transcription file: ``<s> words </s> (clip_id)``."""
    root = CACHE / "pocketsphinx/test/data" / folder
    out = []
    for line in _need(root / listing).read_text().splitlines():
        text, _, rest = line.partition("(")
        clip_id = rest.strip(") ")
        words = [w for w in text.split() if w not in ("<s>", "</s>")]
        out.append(Clip(_need(root / f"{clip_id}.wav"), " ".join(words)))
    return out


def first_word_s(clip: Clip) -> float:
    """Where the clip's first word begins (s), by the word alignment beside it (LibriVox
    clips open with 0.2-0.3 s of room tone); 0.0 for a clip without one."""
    ali = clip.path.with_suffix(".json")
    if not ali.exists():
        return 0.0
    spoken = [w["b"] for w in json.loads(ali.read_text())["w"] if not w["t"].startswith("<")]
    return float(spoken[0]) if spoken else 0.0


def librivox() -> list[Clip]:
    """Five LibriVox clips (public domain) with word alignments beside them (.json)."""
    return _transcribed("librivox", "transcription")


def cards() -> list[Clip]:
    """Short command-style clips ("ten of clubs")."""
    return _transcribed("cards", "cards.transcription")


def hello_8k() -> Path:
    """8 kHz recorded speech (no transcript) from Debian linphone-common."""
    return _need(CACHE / "linphone-common/hello8000.wav")


def allison(name: str) -> Path:
    """One of Allison Smith's Asterisk prompts (CC BY-SA 3.0), e.g. ``letters/ascii59`` ("semicolon")."""
    return _need(CACHE / f"asterisk-core-sounds-en-wav/en_US_f_Allison/{name}.wav")

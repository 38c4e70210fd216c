"""Which caller turns carry specifics, and so must not be answered from the cache.

A reply to "my order number is four two seven" or "this is Anna Price" is about that number
or that person: replayed to the next caller who says a different number it would be wrong,
and the key (the normalised words) would not even tell the numbers apart once Whisper
writes them differently. Such a turn is answered fresh unless ``cache.allow_specifics``.

Looked for in the transcript as Whisper writes it (cased and punctuated):

- digits;
- number words ("four", "twenty", "hundred"; "one" too, at the price of "one moment");
- a capitalised word that does not start a sentence and is not "I" (names, places, brands);
- letters spelled out: three single letters in a row ("a b c", "J. O. H. N.") or a hyphenated
  run ("J-O-H-N").
"""

from __future__ import annotations

import re

NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand "
    "million billion dozen".split()
)
_SENTENCE = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z']*(?:-[A-Za-z']+)*\.?|\d")
_PRONOUN_I = re.compile(r"^I(?:'[a-z]+)?$")
_SPELLED_HYPHEN = re.compile(r"\b[A-Za-z](?:-[A-Za-z]){2,}\b")
_ALWAYS_CAPITAL = frozenset({"OK"})


def specifics(transcript: str) -> str | None:
    """Why ``transcript`` must not be cached ("digits", "number word", "name", "spelled"),
    or None when it carries no specifics."""
    if any(ch.isdigit() for ch in transcript):
        return "digits"
    if _SPELLED_HYPHEN.search(transcript):
        return "spelled"
    singles = 0
    for sentence in _SENTENCE.split(transcript.strip()):
        for i, tok in enumerate(_TOKEN.findall(sentence)):
            word = tok.rstrip(".")
            low = word.lower()
            if any(part in NUMBER_WORDS for part in low.split("-")):
                return "number word"
            singles = singles + 1 if len(word) == 1 else 0
            if singles >= 3:
                return "spelled"
            if i > 0 and word[:1].isupper() and not _PRONOUN_I.match(word) and word not in _ALWAYS_CAPITAL:
                return "name"
    return None

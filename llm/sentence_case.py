"""Sentence case for a reply's text: the first letter of each sentence upper case.

The small LM learned part of its replies from lower-cased chat data, and about one reply in
twenty starts with a lower-case word ("yeah I am.", "what? what is your favorite movie?").
Speech does not hear it; a transcript, a browser page and a judge that parses sentences do.
A letter's case depends only on the text before it, so the text of a streamed reply's first
clause stays a prefix of the whole reply's.
"""

from __future__ import annotations

import re

# a lower-case letter at the start, or after a sentence end, spaces and opening quotes
_SENTENCE_START = re.compile(r"(^|[.!?][\"')\]]*\s+)([\"'(\[]*)([a-z])")
# a period that ends an abbreviation, not a sentence: "p.m.", "e.g.", "Dr."
_ABBREVIATION = re.compile(r"(\b\w\.\w\.|\b(?:mr|mrs|ms|dr|st|vs|etc|approx)\.)[\"')\]]*\s+$", re.IGNORECASE)


def sentence_case(text: str) -> str:
    def up(m: re.Match[str]) -> str:
        if m.start() > 0 and _ABBREVIATION.search(text, 0, m.start(2)):
            return m.group(0)
        return m.group(1) + m.group(2) + m.group(3).upper()

    return _SENTENCE_START.sub(up, text)

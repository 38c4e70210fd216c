"""One dialogue pair: what the caller said and the reply, with where it came from.

Its own module so that the sources (`llm.data`, `llm.persona`) can all make pairs without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    prompt: str
    response: str
    source: str

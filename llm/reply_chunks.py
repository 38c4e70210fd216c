"""A reply as text chunks, for frameworks whose LLM is a stream (LiveKit's `LLMStream`,
Pipecat's text frames): its first part (what ``ready`` accepts: a clause, a sentence) as
soon as it is written, then the rest.

It works with any responder whose ``agenerate(..., ready=...)`` returns a `Reply` at the
first text that satisfies ``ready`` and decodes the rest in `Reply.tail` (the embedded block
LM with ``llm.stream``, a remote LM); one that does not stream gives one chunk, the whole
reply. Past the deadline the block LM ends the reply at a sentence end, never inside one.
Leaving the iteration early (the consumer cancelled or closed it: an interruption) stops
the rest's decoding: the embedded LM's worker at its next pass, a remote LM's request.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any


async def reply_chunks(
    responder: Any, user_text: str, history: list[tuple[str, str]] | tuple = (),
    deadline_s: float | None = None, ready: Callable[[str], bool] | None = None,
) -> AsyncIterator[str]:
    """Yields the reply's text: what ``ready`` accepted first, then the rest (with its leading
    space). Together they are the whole reply, less any leading space; a chunk that holds
    only spaces is not yielded."""
    reply = await responder.agenerate(user_text, history, deadline_s=deadline_s, ready=ready)
    try:
        if reply.text.strip():
            yield reply.text.lstrip()
        if reply.tail is not None:
            whole = await reply.complete()
            # the whole text starts with what was sent (a character split between the two
            # pieces' bytes excepted): send what follows the part they share
            rest = whole[len(os.path.commonprefix([whole, reply.text])):]
            if rest.strip():
                yield rest
    finally:
        reply.cancel()  # nothing when it ended; else the rest is not wanted

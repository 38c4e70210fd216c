"""A streamed reply from the embedded block diffusion LM: its first clause comes back while
the rest is still being decoded, the whole text is the one the unhurried decoder writes (up
to a sentence end, when the deadline has passed), never cut inside a sentence, and cancelling
the rest stops the worker. The real weights throughout."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from llm.config import LlmConfig
from llm.decoder import DecodeCancelled
from llm.reply_chunks import reply_chunks
from llm.responder import Responder
from voice.tts import first_sentence_ready, split_for_speech

LONG = "Ask not what your country can do for you. Ask what you can do for your country."


def first_clause_ready(text: str) -> bool:
    """The session's rule: a first clause that more text cannot change."""
    return len(split_for_speech(text)) >= 2


class RecordingPool:
    """A fake worker pool (isolates the responder from `voice.workers`): runs each job in a
    thread, as the real pool does, and records how the job itself ended."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.finished = threading.Event()

    async def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def job() -> Any:
            try:
                out = fn(*args, **kwargs)
            except DecodeCancelled:
                self.ended.append("cancelled")
                raise
            finally:
                self.finished.set()
            self.ended.append("done")
            return out

        return await asyncio.to_thread(job)

    async def wait_finished(self, timeout_s: float = 10.0) -> None:
        t0 = time.monotonic()
        while not self.finished.is_set() and time.monotonic() - t0 < timeout_s:
            await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def responder() -> Responder:
    return Responder.load(LlmConfig(), turn_end=False)


def test_the_block_lm_streams_unless_told_not_to(responder: Responder) -> None:
    assert responder.streams
    whole = Responder(responder.lm, LlmConfig(stream=False))
    assert not whole.streams


def test_the_first_clause_comes_back_first_and_the_tail_completes_it(responder: Responder) -> None:
    unhurried = responder.generate(LONG)
    assert len(split_for_speech(unhurried.text)) >= 2, unhurried.text  # else nothing to stream

    async def go() -> tuple[str, str, int]:
        reply = await responder.agenerate(LONG, ready=first_clause_ready)
        assert reply.tail is not None
        early, n_early = reply.text, len(reply.ids)
        full = await reply.complete()
        return early, full, n_early

    early, full, n_early = asyncio.run(go())
    assert full == unhurried.text
    assert full.startswith(early) and len(early) < len(full)
    assert first_clause_ready(early)
    assert 0 < n_early < len(unhurried.ids)


def test_a_reply_that_ends_before_its_first_clause_is_ready_comes_whole(responder: Responder) -> None:
    async def go() -> tuple[bool, str]:
        reply = await responder.agenerate(LONG, ready=lambda text: False)
        return reply.tail is None, reply.text

    no_tail, text = asyncio.run(go())
    assert no_tail
    assert text == responder.generate(LONG).text


def test_a_late_streamed_reply_ends_at_a_sentence_end_never_inside_one(responder: Responder) -> None:
    """Past a 1 ms deadline the whole reply (not streamed) stops where it is 60 ms later, inside
    its one sentence; streamed, handed over at once, it goes on to the sentence's end."""
    cut = responder.generate(LONG, deadline_s=0.001)
    unhurried = responder.generate(LONG)
    assert unhurried.text.endswith((".", "!", "?")) and unhurried.text.count(".") == 1, unhurried.text
    assert len(cut.ids) < len(unhurried.ids)

    async def go() -> str:
        reply = await responder.agenerate(LONG, deadline_s=0.001, ready=lambda text: True)
        return await reply.complete()

    assert asyncio.run(go()) == unhurried.text


def test_cancelling_the_rest_stops_the_worker(responder: Responder) -> None:
    pool = RecordingPool()
    r = Responder(responder.lm, responder.cfg)
    r.workers = pool

    async def go() -> str:
        reply = await r.agenerate(LONG, ready=lambda text: True)  # handed over after one pass
        reply.cancel()  # before the tail first ran: a barge-in, a superseded speculation
        text = await reply.complete()
        await pool.wait_finished()
        return text

    text = asyncio.run(go())
    assert pool.ended == ["cancelled"]
    assert responder.generate(LONG).text.startswith(text)


def test_the_reply_as_chunks_is_its_first_sentence_then_the_rest(responder: Responder) -> None:
    """What the LiveKit and Pipecat plugins send: the text up to the first sentence and the
    start of the next, then the rest; together the unhurried reply."""
    prompt = "hello, how are you today?"
    unhurried = responder.generate(prompt).text
    assert first_sentence_ready(unhurried), unhurried  # two sentences: else nothing to stream

    chunks = asyncio.run(_chunks(responder, prompt))
    assert "".join(chunks) == unhurried
    assert len(chunks) == 2 and first_sentence_ready(chunks[0]), chunks
    unstreamed = Responder(responder.lm, LlmConfig(stream=False))
    assert asyncio.run(_chunks(unstreamed, prompt)) == [unhurried]  # one chunk when it does not stream


async def _chunks(responder: Responder, prompt: str) -> list[str]:
    return [c async for c in reply_chunks(responder, prompt, ready=first_sentence_ready)]


def test_closing_the_chunks_after_the_first_stops_the_worker(responder: Responder) -> None:
    pool = RecordingPool()
    r = Responder(responder.lm, responder.cfg)
    r.workers = pool

    async def go() -> str:
        chunks = reply_chunks(r, LONG, ready=lambda text: True)  # the first after one pass
        first = await anext(chunks)
        await chunks.aclose()  # an interruption: the plugin's stream is closed
        await pool.wait_finished()
        return first

    first = asyncio.run(go())
    assert pool.ended == ["cancelled"]
    assert responder.generate(LONG).text.startswith(first)

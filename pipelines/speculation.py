"""A speculative turn: work started on a partial transcript before the caller has finished.

At each pause the session snapshots the caller's audio and starts, in order: the ASR
hypothesis of exactly that audio, a reply block for it, and the first clause of the reply as
audio. If the turn then commits with the same audio (no further speech) or the same
normalised transcript, all of it is reused and the reply can play at once. Words the reply
cache has answered before need no reply block and no audio at all (``Speculation.cache``). Otherwise it is
cancelled; its compute is counted as waste. Speculative replies never enter the history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm.responder import Reply
from pipelines.reply_cache.cache import Lookup
from voice.asr import normalize_words


def covers(audio_end: float, speech_end: float) -> bool:
    """Does audio up to ``audio_end`` include the voiced frame ending at ``speech_end``? The two
    times are summed differently (samples vs frames), so they are compared to the millisecond."""
    return audio_end >= speech_end - 1e-3


def same_words(a: str, b: str) -> bool:
    return normalize_words(a) == normalize_words(b)


@dataclass
class Speculation:
    samples: int  # caller audio (16 kHz samples) the hypothesis covers
    started_t: float  # call time
    asr: asyncio.Task[str]
    reply: asyncio.Task[Reply | None] | None = None
    first_audio: asyncio.Task[np.ndarray | None] | None = None
    first_part: str = ""
    text: str | None = None
    ready_t: float | None = None  # call time its first clause of audio was ready
    chain: asyncio.Task[None] | None = None  # `run_chain` on this speculation, once started
    cache: Lookup | None = None  # the reply cache answered these words: no LM or TTS work
    _t0: float = field(default_factory=time.perf_counter)
    _t_last_done: float | None = None

    def __post_init__(self) -> None:
        self.track(self.asr)

    def track(self, task: asyncio.Task[Any]) -> None:
        """Count ``task`` in this speculation's compute time (until it ends)."""
        def done(_: asyncio.Task[Any]) -> None:
            self._t_last_done = time.perf_counter()

        task.add_done_callback(done)

    def cancel(self, keep: Reply | None = None) -> float:
        """Cancel whatever is still running, a reply still streaming included (unless it is
        ``keep``, shared with the speculation that is used); returns the wall seconds this
        speculation worked: from its start to now if something was still running, else to when
        its last step ended."""
        running = False
        for t in (self.asr, self.reply, self.first_audio):
            if t is not None and not t.done():
                t.cancel()
                running = True
        if self.reply is not None and self.reply.done() and not self.reply.cancelled() \
                and self.reply.exception() is None:
            reply = self.reply.result()
            if reply is not None and reply is not keep and reply.tail is not None and not reply.tail.done():
                reply.cancel()
                running = True
        end = time.perf_counter() if running or self._t_last_done is None else self._t_last_done
        return max(0.0, end - self._t0)

    @property
    def cancelled(self) -> bool:
        return any(t is not None and t.cancelled() for t in (self.asr, self.reply, self.first_audio))

    @property
    def done(self) -> bool:
        tasks = [t for t in (self.asr, self.reply, self.first_audio) if t is not None]
        return all(t.done() for t in tasks)


def with_first_audio_of(specs: list[Speculation], exclude: Speculation, reply_text: str) -> Speculation | None:
    """Another live speculation whose finished reply is ``reply_text`` and that synthesises
    (or has synthesised) its first clause: that audio can be shared, not made again."""
    for other in specs:
        if other is exclude or other.first_audio is None or other.first_audio.cancelled():
            continue
        if other.reply is None or not other.reply.done() or other.reply.cancelled():
            continue
        prev = other.reply.result()
        if prev is not None and prev.text == reply_text:
            return other
    return None


async def run_chain(
    spec: Speculation,
    make_reply: Callable[[str], Awaitable[Reply | None]],
    make_first_audio: Callable[[str], Awaitable[tuple[str, np.ndarray] | None]],
) -> None:
    """ASR text -> reply -> first clause audio, each step a task others can await."""
    text = await spec.asr
    spec.text = text
    if not text.strip():
        return
    spec.reply = asyncio.ensure_future(make_reply(text))
    spec.track(spec.reply)
    reply = await spec.reply
    if reply is None or not reply.text:
        return

    async def first() -> np.ndarray | None:
        out = await make_first_audio(reply.text)
        if out is None:
            return None
        spec.first_part = out[0]
        return out[1]

    spec.first_audio = asyncio.ensure_future(first())
    spec.track(spec.first_audio)
    await spec.first_audio

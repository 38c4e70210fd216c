"""A call's speculation: the work started on a hypothesis before the turn is committed.

`SpeculationPath` is the part of `pipelines.session.CallSession` that, at a pause or on a
partial that reads as finished, starts the chain of `pipelines.speculation`: the hypothesis
of exactly the audio so far, a reply for it, and the reply's first clause as audio. It keeps
at most ``turn.max_speculations`` live, shares a reply or a first clause between speculations
on the same words, and records when a hypothesis covering the whole turn was ready. It never
decides a turn (`CallSession` does) and never plays audio (`ReplyPath` does, after the commit).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from llm.responder import Reply
from pipelines.events import Partial, SpeculationStarted
from pipelines.session_reply import ReplyPath
from pipelines.speculation import Speculation, covers, run_chain, same_words, with_first_audio_of
from voice.asr import SAMPLE_RATE as ASR_RATE

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipelines.report import TurnRecord


class SpeculationPath(ReplyPath):
    """Mixin of `CallSession` between the pause and the commit. The turn state it reads is the
    session's, declared here."""

    _committed: bool
    _awaited_by_pause: asyncio.Task[None] | None
    _bg: set[asyncio.Task[Any]]
    _covering_partial: Callable[[], asyncio.Task[None] | None]
    _maybe_cut: Callable[..., None]
    _on_evidence: Callable[[], None]

    def _spec_for_text(self, text: str, samples: int) -> Speculation:
        async def known() -> str:
            return text

        spec = Speculation(samples=samples, started_t=self.clock.now(), asr=asyncio.ensure_future(known()))
        spec.text = text
        self._chain(spec, "partial")
        return spec

    def _add_spec(self, spec: Speculation) -> None:
        live = [x for x in self._specs if not x.done]
        if len(live) >= max(1, self.cfg.turn.max_speculations):
            oldest = live[0]
            self.wasted_s += oldest.cancel()
            self._specs.remove(oldest)
        self._specs.append(spec)

    def _chain(self, spec: Speculation, on: Literal["pause", "partial"]) -> None:
        """Starts the reply and first-clause chain of ``spec``, begun ``on`` a "pause" or a
        "partial" that reads as finished."""
        utt = self.utt
        assert utt is not None
        utt.speculation["started"].append({"t": round(spec.started_t, 3), "on": on})
        self.bus.emit(SpeculationStarted(self.session_id, spec.started_t, text=spec.text or ""))
        history = list(self.history)

        async def reply(text: str) -> Reply | None:
            if self.reply_cache is not None:
                look = await self.reply_cache.lookup(text, history)
                self._note_cache_state()
                if look.entry is not None:  # answered before: nothing to decode or synthesise
                    spec.cache = look
                    spec.ready_t = self.clock.now()
                    return None
            # another speculation on the same words already has a reply: share it
            for other in self._specs:
                if other is not spec and other.reply is not None and other.text is not None \
                        and same_words(other.text, text) and not other.reply.cancelled():
                    return await asyncio.shield(other.reply)
            prev = self._prev_reply(spec)
            if prev is not None:
                utt.speculation["warm_starts"] += 1
            return await self._llm(text, history, speculative=True, prev=prev)

        async def first_audio(reply_text: str) -> tuple[str, np.ndarray] | None:
            # the same reply's first clause is synthesised once per turn
            other = with_first_audio_of(self._specs, spec, reply_text)
            if other is None or other.first_audio is None:
                out = await self._first_audio(reply_text)
            else:
                pcm = await asyncio.shield(other.first_audio)
                out = (other.first_part, pcm) if pcm is not None else None
            spec.ready_t = self.clock.now()
            return out

        spec.chain = self._spawn(run_chain(spec, reply, first_audio))

    def _speculate(self) -> None:
        if self.utt is None:
            return
        last = self._last_partial
        if (
            self._covering_partial() is None
            and last is not None
            and covers(last[0], self.utt.user_speech_end_s)
            and any(x.text is not None and same_words(x.text, last[1]) and not x.cancelled for x in self._specs)
        ):
            self._maybe_cut(self.utt)
            return  # a finished partial covers the speech and is already being answered
        live = [s for s in self._specs if not s.done]
        if not self.cfg.turn.speculation:
            # still compute the hypothesis at the pause: the endpointer needs it
            if not live:
                self._specs.append(self._new_spec(chain=False))
            return
        self._add_spec(self._new_spec(chain=True))

    def _new_spec(self, chain: bool) -> Speculation:
        n = int(self.asr.duration * ASR_RATE)
        utt = self.utt
        assert utt is not None

        covering = self._covering_partial()
        self._awaited_by_pause = covering  # that partial's answer is this speculation's

        async def hypothesis() -> str:
            if covering is not None:
                await asyncio.shield(covering)
            last = self._last_partial
            if utt is self.utt and last is not None and covers(last[0], utt.user_speech_end_s):
                # a partial (done, or running when the pause came) covers all the speech:
                # it is this pause's hypothesis, and the ASR need not run again
                self._maybe_cut(utt)
                return last[1]
            upd = await self.asr.process_iter()
            self._note_hypothesis(utt, upd.audio_end)
            self._maybe_cut(utt)
            if upd.partial and utt is self.utt:
                t = self.clock.now()
                utt.partials.append({"t": round(t, 3), "text": upd.partial, "stable": upd.stable})
                self.bus.emit(Partial(self.session_id, t, text=upd.partial, stable=upd.stable))
            return upd.partial

        spec = Speculation(samples=n, started_t=self.clock.now(), asr=asyncio.ensure_future(hypothesis()))
        self._bg.add(spec.asr)
        spec.asr.add_done_callback(self._bg.discard)
        spec.asr.add_done_callback(lambda _: self._on_evidence())
        if chain:
            self._chain(spec, "pause")
        return spec

    def _note_hypothesis(self, utt: TurnRecord, audio_end: float) -> None:
        """Record when a transcript covering every voiced frame of the turn was ready (ms after
        the last voiced frame): the earliest the turn's final transcript can be known."""
        if utt is self.utt and not self._committed and covers(audio_end, utt.user_speech_end_s):
            utt.speculation["final_text_ms"] = round((self.clock.now() - utt.user_speech_end_s) * 1000, 1)

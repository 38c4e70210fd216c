"""A call's reply path: from a committed turn to the agent's audio.

`ReplyPath` is the half of `pipelines.session.CallSession` that answers a committed turn:
the final transcript (the speculation's hypothesis when it covers the turn), the reply (from
the reply cache, a speculation on the same words, or the LM now), its first clause as audio,
playing it, the turn's stages and budget violations, and the rest of the reply clause by
clause. The turn logic that decides *when* to answer stays in `CallSession`; this class reads
its state (the turn, the speculations, the history) and never decides a turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from llm.remote_errors import RemoteLmError
from llm.responder import Reply
from pipelines.budgets import stage_violations
from pipelines.events import CacheState, LlmError, Resume, TurnCompleted, Violation
from pipelines.reply_cache.cache import Lookup
from pipelines.reply_cache.entry import CachedReply
from pipelines.report import TurnRecord
from pipelines.speculation import Speculation, same_words
from voice.asr import SAMPLE_RATE as ASR_RATE
from voice.asr import normalize_words
from voice.audio import StreamResampler
from voice.level import LevelTrack, first_audible_offset
from voice.tts import unheard_sentences
from voice.workers import AHEAD

if TYPE_CHECKING:
    from pipelines.config import AgentConfig, BudgetConfig
    from pipelines.events import EventBus
    from pipelines.reply_cache.cache import ReplyCache
    from pipelines.session import Engines
    from pipelines.transport import AudioOutput, Clock
    from voice.asr import StreamingASR

log = logging.getLogger(__name__)


@dataclass
class CutReply:
    """A reply the caller barged into, held until the barge-in's words are known."""

    turn: TurnRecord  # the turn whose reply was cut
    by: TurnRecord  # the caller turn that cut it
    heard_words: int  # of the reply, by the time heard


class ReplyPath:
    """Mixin of `CallSession`: everything after `CallSession._commit`. The state it reads and
    writes is the session's, declared here."""

    session_id: str
    cfg: AgentConfig
    engines: Engines
    clock: Clock
    output: AudioOutput
    bus: EventBus
    budgets: BudgetConfig
    asr: StreamingASR
    reply_cache: ReplyCache | None
    utt: TurnRecord | None
    turns: list[TurnRecord]
    history: list[tuple[str, str]]
    muted: bool
    closed: bool
    wasted_s: float
    _specs: list[Speculation]
    _last_partial: tuple[float, str] | None
    _playing: TurnRecord | None
    _unannounced: TurnRecord | None
    _announced: set[int]
    _cut: CutReply | None
    _resume_base: int
    _out_rs: StreamResampler | None
    _handed_t: float  # when `_play` last handed audio to the transport (after resampling)
    _fallback_pcm: dict[str, np.ndarray]
    _cache_up: bool
    _levels: LevelTrack
    _synth: Callable[..., Awaitable[np.ndarray]]
    _spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]]
    _partial_covers_turn: Callable[[], bool]
    _closing_said: Callable[[TurnRecord], None]

    def _prev_reply(self, exclude: Speculation | None = None) -> Reply | None:
        """The newest finished speculative block of this turn, to warm-start the next one."""
        if not self.cfg.turn.redenoise or not getattr(self.engines.responder, "warm_start", True):
            return None
        for s in reversed(self._specs):
            if s is not exclude and s.reply is not None and s.reply.done() and not s.reply.cancelled():
                if s.reply.exception() is None and s.reply.result() is not None:
                    return s.reply.result()
        return None

    async def _llm(
        self, text: str, history: list[tuple[str, str]], speculative: bool, prev: Reply | None = None
    ) -> Reply | None:
        # Speculative work happens before the turn ends, so it gets a longer deadline than the
        # committed path's budget: it is still bounded, and it is cancellable.
        # A remote LM streams: the reply returns once its first clause for TTS is complete
        # (the deadline bounds that), and the rest follows in the reply's tail.
        budget_s = self.budgets.llm_block_ms / 1000.0
        deadline = budget_s * 4 if speculative else budget_s
        utt = self.utt
        if utt is not None:
            utt.llm_requests += 1
        responder = self.engines.responder
        streamed = {"ready": self._first_clause_ready} if getattr(responder, "streams", False) else {}
        try:
            return await responder.agenerate(text, history, deadline_s=max(deadline, 0.005), prev=prev, **streamed)
        except RemoteLmError as err:
            self._llm_failed(err, utt, speculative)
            return None

    def _first_clause_ready(self, text: str) -> bool:
        """Has ``text`` a first clause that more text cannot change? (Then TTS can start.) The
        embedded LM asks this in its worker thread after each pass: it reads only ``text``."""
        return len(self.engines.tts.split(text)) >= 2

    def _llm_failed(self, err: Exception, utt: TurnRecord | None, speculative: bool) -> None:
        kind = getattr(err, "kind", type(err).__name__)
        if utt is not None and not speculative:
            utt.llm_error = kind
        if speculative:
            log.info("session %s: speculative LM request failed (%s): %s", self.session_id, kind, err)
        else:
            log.warning("session %s: LM request failed (%s): %s", self.session_id, kind, err)
        if getattr(err, "repeat", False):
            return  # already reported (a refused key)
        self.bus.emit(LlmError(self.session_id, self.clock.now(), error=kind, message=str(err),
                               status=getattr(err, "status", None), turn=utt.index if utt is not None else -1,
                               speculative=speculative))

    async def _first_audio(self, reply_text: str) -> tuple[str, np.ndarray] | None:
        parts = self.engines.tts.split(reply_text)
        if not parts:
            return None
        return parts[0], await self._synth(parts[0])

    def _matching_spec(self, n_samples: int, text: str | None) -> Speculation | None:
        for s in reversed(self._specs):
            if s.samples == n_samples and not s.asr.cancelled():
                return s
        if text is not None:
            for s in reversed(self._specs):
                if s.text is not None and same_words(s.text, text) and s.reply is not None:
                    return s
        return None

    async def _respond(self, utt: TurnRecord, t_commit: float) -> None:
        try:
            await self._respond_inner(utt, t_commit)
        except asyncio.CancelledError:
            raise
        except Exception:  # one bad turn must not end the call
            log.exception("session %s: turn %d failed", self.session_id, utt.index)

    async def _respond_inner(self, utt: TurnRecord, t_commit: float) -> None:
        n = int(self.asr.duration * ASR_RATE)
        # 1. final transcript: the hypothesis of exactly this audio, if one was started
        spec = self._matching_spec(n, None)
        if self._partial_covers_turn() and self._last_partial is not None:
            text = self._last_partial[1]
        elif spec is not None and spec.samples == n:
            text = await spec.asr
        else:
            text = (await self.asr.finish()).partial
        t_asr = self.clock.now()
        utt.transcript = text.strip()
        if not normalize_words(utt.transcript):  # noise, a breath, or Whisper's lone "."
            self.turns = [x for x in self.turns if x is not utt]
            if self.utt is utt:
                self.utt = None
            if self._cut is not None and self._cut.by is utt:
                await self._resume_cut_reply(self._cut)
            return
        self._settle_cut()  # the caller did take the turn: the reply they cut stays cut
        # 2. reply block: from the cache, else reuse a speculation on the same words, else regenerate
        spec = self._matching_spec(-1, utt.transcript)
        look = await self._cache_lookup(utt)
        cached = look.entry if look is not None else None
        if cached is not None:
            spec = None  # every speculation goes: the reply is here, whole
        hit = spec is not None and spec.reply is not None and not spec.reply.cancelled()
        used = [s for s in self._specs if s.reply is not None or s.first_audio is not None]
        utt.speculation["used"] = bool(used) or hit
        utt.speculation["hit"] = hit
        reply: Reply | None = None
        if hit:
            assert spec is not None and spec.reply is not None
            reply = await spec.reply
        warm = self._prev_reply() if not hit and cached is None else None  # before the other speculations go
        for s in self._specs:
            if s is not spec:
                w = s.cancel(keep=reply)
                self.wasted_s += w
                utt.speculation["wasted_ms"] = round(utt.speculation["wasted_ms"] + w * 1000, 1)
        self._specs = [spec] if spec is not None else []
        fallback_start: float | None = None
        prepared = cached is not None or (
            hit and spec is not None and spec.first_audio is not None and spec.first_audio.done())
        if self.cfg.turn.fallback and not prepared:
            # Nothing is ready to say: cover the wait with a short acknowledgement.
            fallback_start = await self._play_fallback(utt)
        if reply is None and cached is None:
            if warm is not None:
                utt.speculation["warm_starts"] += 1
            reply = await self._llm(utt.transcript, list(self.history), speculative=False, prev=warm)
            # None: the LM failed or missed its deadline (``utt.llm_error``); the fallback covers it
        t_llm = self.clock.now()
        try:
            await self._answer(utt, reply, spec if hit else None, fallback_start, t_commit, t_asr, t_llm,
                               cached, look)
        except asyncio.CancelledError:
            if reply is not None:
                reply.cancel()  # a barge-in: the rest of a streamed reply is not wanted
            raise

    async def _answer(
        self, utt: TurnRecord, reply: Reply | None, spec: Speculation | None, fallback_start: float | None,
        t_commit: float, t_asr: float, t_llm: float, cached: CachedReply | None, look: Lookup | None,
    ) -> None:
        hit = spec is not None
        if cached is not None:
            text = cached.text
        elif reply is None:
            if fallback_start is not None:
                text = ""  # the fallback is already playing, and there is nothing more to say
            else:
                text = self.cfg.turn.fallback_text
                utt.first_audio = "fallback"
        elif not reply.text:
            return
        else:
            text = reply.text
            utt.stages["llm_steps"] = reply.stats.steps
            utt.llm_step_times_s = [round(x, 4) for x in reply.stats.step_times]
        utt.response = utt.heard_response = text
        # 3. first clause of audio
        parts = list(cached.clauses) if cached is not None else self.engines.tts.split(text)
        first: np.ndarray | None = cached.audio[0] if cached is not None else None
        if hit and spec is not None and spec.chain is not None and not spec.chain.done():
            # the reply landed just now and its chain is making (or about to make) the first
            # clause: wait for it rather than synthesising the same clause twice side by side
            await asyncio.wait([spec.chain])
        if hit and spec is not None and spec.first_audio is not None and spec.first_part == (parts[0] if parts else ""):
            first = await spec.first_audio
        if first is None and parts:
            first = await self._synth(parts[0])
        clause_audio = [first] if first is not None else []  # the whole reply, for the cache
        t_tts = self.clock.now()
        if hit and spec is not None and spec.ready_t is not None:
            # when the prepared first clause was ready, from the caller's last voiced frame
            utt.speculation["ready_ms"] = round((spec.ready_t - utt.user_speech_end_s) * 1000, 1)
        # 4. play
        if self._playing is not utt:
            self._playing = utt
            self._begin_output(utt.index)
        t_out = self.clock.now()
        start = self._play(first) if first is not None else None
        if start is None and fallback_start is None:
            return
        if start is not None and fallback_start is None:
            # the first clause reached the transport at its rate: resampling it was part of
            # getting the audio ready, what comes after is the transport's output buffer
            t_tts = t_out = self._handed_t
        if start is not None and first is not None:
            utt.first_content_audio_s = start
            audible_s = start + first_audible_offset(first, self.engines.tts.sample_rate)
        if fallback_start is not None:
            utt.first_audio = "fallback"
            start = fallback_start
            pcm = self._fallback_pcm.get(self.cfg.turn.fallback_text)
            audible_s = start + (first_audible_offset(pcm, self.engines.tts.sample_rate) if pcm is not None else 0.0)
        utt.agent_audio_start_s = start
        utt.agent_audible_s = audible_s
        utt.speech_end_s = self._levels.last_audible(utt.user_speech_end_s)
        utt.vad_gap_ms = (start - utt.user_speech_end_s) * 1000
        utt.gap_ms = (audible_s - utt.speech_end_s) * 1000
        utt.stages.update({
            "vad_endpoint": (t_commit - utt.user_speech_end_s) * 1000,
            "asr_final": (t_asr - t_commit) * 1000,
            "llm_block": (t_llm - t_asr) * 1000,
            "tts_first_audio": (t_tts - t_llm) * 1000,
            "output": (start - t_out) * 1000,
        })
        self._check_budgets(utt)
        rest = parts[1:]
        rest_audio = list(cached.audio[1:]) if cached is not None else None
        if reply is not None and reply.tail is not None:
            # a streamed reply: the first clause is playing, the rest has been arriving meanwhile
            full = await reply.complete()
            rest = _after_first(self.engines.tts.split(full), parts)
            utt.response = utt.heard_response = full
            utt.stages["llm_steps"] = reply.stats.steps
            if reply.stats.step_times:
                utt.llm_step_times_s = [round(x, 4) for x in reply.stats.step_times]
            if reply.error is not None:
                self._llm_failed(reply.error, utt, speculative=False)
        if reply is not None and reply.tokens_per_s is not None:
            utt.stages["llm_tokens_per_s"] = round(reply.tokens_per_s, 1)
        self.history.append((utt.transcript, utt.response))
        # the rest of the reply, clause by clause; cancellation (barge-in) stops it here
        for i, part in enumerate(rest):
            pcm = rest_audio[i] if rest_audio is not None else await self._synth(part, AHEAD)
            if self._playing is not utt:
                break
            self._play(pcm)
            clause_audio.append(pcm)
        if look is not None and cached is None:
            failed = (fallback_start is not None or utt.first_audio == "fallback"
                      or getattr(reply, "error", None) is not None)
            self._spawn(self._cache_store(utt, look, utt.response, parts[:1] + rest, clause_audio, reply, failed))
        if self._playing is utt:
            self._play(np.zeros(0, dtype=np.int16), last=True)  # flush the resampler's tail
        utt.agent_audio_end_s = self.output.busy_until()
        self._final_once_heard(utt)
        self._closing_said(utt)

    async def _resume_cut_reply(self, cut: CutReply) -> None:
        """A false interruption: the barge-in that cut ``cut.turn``'s reply had no words in it
        (a cough, a door, line noise). The reply goes on from the start of the sentence the
        caller was cut off in, as a person picks up again, and the turn is final once it has
        been heard (or cut again)."""
        self._cut = None
        turn = cut.turn
        text = unheard_sentences(turn.response, cut.heard_words)
        if not text or self._playing is not None or self.muted:
            self._announce(turn, self.clock.now())
            return
        parts = self.engines.tts.split(text)
        first = await self._synth(parts[0])
        if self._playing is not None:  # another reply began meanwhile
            self._announce(turn, self.clock.now())
            return
        self._playing = turn
        self._begin_output(turn.index)
        self._resume_base = len(turn.response.split()) - len(text.split())
        turn.agent_audio_end_s = None
        turn.heard_response = turn.response
        if self.history and self.history[-1][0] == turn.transcript:
            self.history[-1] = (turn.transcript, turn.response)
        start = self._play(first)
        turn.resumed_s = start if start is not None else self.clock.now()
        self.bus.emit(Resume(self.session_id, self.clock.now(), turn=turn.index, text=text))
        for part in parts[1:]:
            pcm = await self._synth(part, AHEAD)
            if self._playing is not turn:
                break
            self._play(pcm)
        if self._playing is turn:
            self._play(np.zeros(0, dtype=np.int16), last=True)
            turn.agent_audio_end_s = self.output.busy_until()
            self._final_once_heard(turn)

    def _final_once_heard(self, turn: TurnRecord) -> None:
        """``turn``'s reply is all queued: its `turn` event goes out once it has been heard (any
        earlier turn still waiting for its event is final now)."""
        if self._unannounced is not None and self._unannounced is not turn:
            self._announce(self._unannounced, self.clock.now())
        self._unannounced = turn
        self._announce_if_heard()

    def _settle_cut(self) -> None:
        """A reply held after a barge-in is final as it was cut: its `turn` event goes out."""
        if self._cut is not None:
            turn, self._cut = self._cut.turn, None
            self._announce(turn, turn.agent_audio_end_s or self.clock.now())

    async def _cache_lookup(self, utt: TurnRecord) -> Lookup | None:
        """The committed turn's reply from the cache (a speculation on the same words may have
        found it already); the turn's report says what the cache did."""
        if self.reply_cache is None:
            return None
        known = self.reply_cache.turn_key(utt.transcript, self.history)
        look: Lookup | None = None
        if known is not None and known.state == "miss":
            for s in reversed(self._specs):
                if s.cache is not None and s.cache.key == known.key and s.cache.entry is not None:
                    look = s.cache
                    break
        if look is None:
            look = await self.reply_cache.lookup(utt.transcript, self.history)
        utt.cache = look.report()
        self._note_cache_state()
        return look

    async def _cache_store(self, utt: TurnRecord, look: Lookup, text: str, parts: list[str],
                           audio: list[np.ndarray], reply: Reply | None, fallback: bool) -> None:
        assert self.reply_cache is not None
        outcome = await self.reply_cache.store(
            look, text, parts, audio, self.engines.tts.sample_rate,
            deadline_missed=reply is None or reply.stats.deadline_hit, fallback=fallback)
        utt.cache["stored"] = outcome == "stored"
        if outcome != "stored":
            utt.cache["not_stored"] = outcome
        self._note_cache_state()

    def _note_cache_state(self) -> None:
        """A `cache` event when the cache's backend went down (this call goes on uncached) or
        came back since this call last said so."""
        cache = self.reply_cache
        if cache is None or cache.available == self._cache_up or self.closed:
            return
        self._cache_up = cache.available
        self.bus.emit(CacheState(self.session_id, self.clock.now(), backend=cache.backend,
                                 available=cache.available, error=cache.last_error))

    def _announce_if_heard(self) -> None:
        u = self._unannounced
        if u is not None and u.agent_audio_end_s is not None and self.clock.now() >= u.agent_audio_end_s:
            self._announce(u, u.agent_audio_end_s)

    def _announce(self, turn: TurnRecord, t: float) -> None:
        """The turn is final: its one `turn` event, with what the caller heard."""
        if self._unannounced is turn:
            self._unannounced = None
        if id(turn) not in self._announced:
            self._announced.add(id(turn))
            self.bus.emit(TurnCompleted(self.session_id, t, report=turn.to_dict()))

    async def _play_fallback(self, utt: TurnRecord) -> float | None:
        text = self.cfg.turn.fallback_text
        pcm = self._fallback_pcm.get(text)
        if pcm is None:
            pcm = self._fallback_pcm[text] = await self._synth(text)
        self._playing = utt
        self._begin_output(utt.index)
        return self._play(pcm)

    def _begin_output(self, turn: int) -> None:
        self.output.begin_turn(turn)
        # one stateful resampler per reply: clause joins get no filter edges
        self._out_rs = StreamResampler(self.engines.tts.sample_rate, self.output.sample_rate, quality="HQ")

    def _play(self, pcm: np.ndarray, last: bool = False) -> float | None:
        if self.muted or (len(pcm) == 0 and not last):
            return None
        if self._out_rs is None:
            self._begin_output(-1)
        assert self._out_rs is not None
        out = self._out_rs.process(pcm, last=last)
        if len(out) == 0:
            return None
        self._handed_t = self.clock.now()
        return self.output.play(out)

    def _check_budgets(self, utt: TurnRecord) -> None:
        # the endpoint's budget is for deciding, not for the silence the endpointer chose to
        # wait (``required_ms``): that wait is the turn-taking policy, reported on its own
        stages = dict(utt.stages)
        if "vad_endpoint" in stages:
            stages["vad_endpoint"] -= float(utt.endpoint.get("required_ms") or 0.0)
        for v in stage_violations(stages, self.budgets):
            utt.violations.append(v)
            self.bus.emit(Violation(self.session_id, self.clock.now(), turn=utt.index, **v))


def _after_first(parts: list[str], first: list[str]) -> list[str]:
    """The clauses of the whole reply ``parts`` after the one already played (``first[0]``)."""
    if not first:
        return parts
    if parts and parts[0] == first[0]:
        return parts[1:]
    said = " ".join(first[0].split())
    text = " ".join(parts)
    return [text[len(said):].strip()] if text.startswith(said) and text[len(said):].strip() else parts[1:]

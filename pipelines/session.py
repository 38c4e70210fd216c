"""One caller's conversation: caller audio in, agent audio out, events on the bus.

Data flows one way: transport → VAD → ASR → turn logic → LLM → TTS → AudioOutput. The
session owns the turn logic (endpointing, barge-in, take-back); what it starts before the
commit is `pipelines.session_speculation`, what it does after is `pipelines.session_reply`. Engines are
shared across sessions and run in worker threads, so the event loop never blocks.

Timeline of a turn (all times on the call timeline):

    caller speech ─────┐ last voiced frame (user_speech_end_s)
                       ├─ pause: speculation starts (ASR → LLM block → first clause audio)
                       ├─ endpoint decision (silence ≥ required by the endpointer)
                       └─ reply plays: from the reply cache if the words were answered before,
                          prepared audio if the speculation hit, else regenerated
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from llm.remote import RemoteResponder
from llm.responder import Responder
from pipelines.config import AgentConfig, BudgetConfig, ConfigError, format_validation_error
from pipelines.endpointing import (
    LOOKS_DONE,
    Endpointer,
    completeness,
    elapsed_ms,
    nearly_function_word,
    surface_kind,
)
from pipelines.events import (
    Dtmf,
    EndpointDecision,
    EventBus,
    Interrupt,
    Partial,
    SessionEnd,
    SessionStart,
    SpeechEnd,
    SpeechStart,
)
from pipelines.reply_cache.cache import ReplyCache
from pipelines.report import TurnRecord, summarize
from pipelines.session_reply import CutReply
from pipelines.session_speculation import SpeculationPath
from pipelines.session_words import OwnWords
from pipelines.speculation import Speculation, covers, same_words
from pipelines.transport import AudioClock, AudioOutput, Clock
from pipelines.turn_audio_opinion import TurnAudioOpinions
from pipelines.turn_end_opinion import TurnEndOpinions
from voice.asr import SAMPLE_RATE as ASR_RATE
from voice.asr import StreamingASR, WhisperEngine, normalize_words
from voice.audio import AudioFrame, StreamResampler
from voice.level import LevelGate, LevelTrack
from voice.smart_turn import SmartTurn
from voice.tts import PiperTTS
from voice.vad import VadSegmenter, WebRtcVad
from voice.workers import AHEAD, NOW, workers_of

log = logging.getLogger(__name__)


@dataclass
class Engines:
    """Models shared by every session of an agent."""

    asr: WhisperEngine
    responder: Responder | RemoteResponder  # the embedded LM, or a remote server (llm.backend)
    tts: PiperTTS
    turn_audio: SmartTurn | None = None  # Smart Turn, when turn.smart_turn is on


class CallSession(SpeculationPath, OwnWords):
    def __init__(
        self,
        engines: Engines,
        cfg: AgentConfig,
        output: AudioOutput,
        clock: Clock,
        bus: EventBus,
        transport: str = "replay",
        session_id: str | None = None,
        vad: VadSegmenter | None = None,
        reply_cache: ReplyCache | None = None,
    ) -> None:
        self.engines = engines
        self.reply_cache = reply_cache
        self._cache_up = True  # the cache backend's state this call last reported
        self.cfg = cfg
        self.budgets = cfg.budgets.model_copy()
        self.output = output
        self.clock = clock
        self.bus = bus
        self.transport = transport
        self.session_id = session_id or uuid.uuid4().hex[:12]
        self.hangup_requested = asyncio.Event()
        self.transfer_requested = asyncio.Event()  # `request_transfer`: the transport hands the call on
        self.transfer: dict[str, Any] | None = None  # {to, why, t, result} of the last transfer asked for
        self.can_transfer = False  # set by a transport that hands calls on (SIP REFER)
        self.muted = False
        self.closed = False
        self.end_reason: str | None = None  # why the call ended (`close`)

        if vad is None:
            gate = (LevelGate(cfg.vad.level_gate_db, noise_share=cfg.vad.noise_margin_share)
                    if cfg.vad.level_gate_db > 0 else None)
            vad = VadSegmenter(WebRtcVad(cfg.vad.aggressiveness, ASR_RATE, cfg.vad.frame_ms),
                               cfg.vad.start_ms, cfg.vad.stop_ms, gate)
        self.vad = vad
        self.asr = StreamingASR(
            engines.asr.transcribe, drafts=engines.asr.drafts, quick_partials=engines.asr.quick_partials,
            workers=workers_of(engines.asr),
        )
        self.endpointer = Endpointer(cfg.turn)
        self._resamplers: dict[int, StreamResampler] = {}
        # recent caller levels: where the caller's speech truly ended
        self._levels = LevelTrack(noise_share=cfg.vad.noise_margin_share)
        self._resampled_t0: dict[int, float] = {}  # call time where each rate's resampled stream began
        self._preroll: deque[np.ndarray] = deque(maxlen=max(1, 200 // cfg.audio.frame_ms))
        self._pause_buf: list[np.ndarray] = []
        self._fallback_pcm: dict[str, np.ndarray] = {}
        self._out_rs: StreamResampler | None = None
        self._handed_t = 0.0
        self._audio_t = 0.0  # end of caller audio received, call time
        self._frame_t = 0.0  # start of the frame being processed, call time

        self.turns: list[TurnRecord] = []
        self.history: list[tuple[str, str]] = []
        self.dtmf: list[dict[str, Any]] = []
        self.said: list[dict[str, Any]] = []
        self.utt: TurnRecord | None = None  # the caller turn being spoken or answered
        self._in_pause = False
        self._pause_voiced_t: float | None = None  # the last voiced frame inside the current pause
        self._committed = False
        self._speech_run_start: float | None = None
        self._started_over_agent = False
        self._last_partial_samples = 0
        self._partial_task: asyncio.Task[None] | None = None
        self._partial_end = 0.0  # call time of the end of the audio the newest partial covers
        self._partial_cost_s = 0.0  # wall seconds the last partial's transcription took
        self._awaited_by_pause: asyncio.Task[None] | None = None
        self._unvoiced_ms = 0.0  # unvoiced audio since the last voiced frame
        self._last_partial: tuple[float, str] | None = None  # (audio end it covers, text)
        self._specs: list[Speculation] = []
        self._responding: asyncio.Task[None] | None = None
        self._playing: TurnRecord | None = None
        # a turn whose reply is all queued but still playing: its one `turn` event goes out
        # when the caller has heard it to the end, or at barge-in, or when the call ends
        self._unannounced: TurnRecord | None = None
        # a reply the caller barged into, its `turn` event held until their words are known:
        # none (a false interruption) and it goes on (`ReplyPath._resume_cut_reply`)
        self._cut: CutReply | None = None
        self._resume_base = 0  # words of the playing turn's reply before the part said again
        self._announced: set[int] = set()  # id() of the turns whose event went out
        self._bg: set[asyncio.Task[Any]] = set()
        self.turn_end = TurnEndOpinions(
            lambda: self.engines.responder, cfg.turn.lm_end_of_turn, self._spawn, self._on_evidence
        )
        self.turn_audio = TurnAudioOpinions(
            lambda: self.engines.turn_audio if cfg.turn.smart_turn else None, self._spawn, self._on_evidence
        )
        self.wasted_s = 0.0
        self.cutoffs_recovered = 0
        self._init_own_words()

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.bus.emit(SessionStart(self.session_id, self.clock.now(), transport=self.transport))
        self._greet()

    async def _synth(self, text: str, priority: int = NOW) -> np.ndarray:
        """Piper, on its worker threads (a reply's later clauses `AHEAD`: behind first clauses)."""
        return await workers_of(self.engines.tts).run(self.engines.tts.synth, text, priority=priority)

    async def close(self, reason: str = "completed") -> dict[str, Any]:
        if not self.closed:
            self.closed = True
            self.end_reason = reason
            await self.idle()
            for s in self._specs:
                self.wasted_s += s.cancel()
            self._specs.clear()
            if self.utt is not None and self.utt not in self.turns and self.utt.transcript:
                self.turns.append(self.utt)
            self._settle_cut()
            if self._unannounced is not None:
                self._announce(self._unannounced, self.clock.now())
            self.bus.emit(SessionEnd(self.session_id, self.clock.now(), reason=reason, turns=len(self.turns)))
        return self.report()

    async def idle(self) -> None:
        """Wait until no work is in flight (used by ``--fast`` replay: compute is free)."""
        while True:
            pending = [t for t in self._bg if not t.done()]
            if self._responding is not None and not self._responding.done():
                pending.append(self._responding)
            if not pending:
                return
            await asyncio.gather(*pending, return_exceptions=True)

    def report(self) -> dict[str, Any]:
        turns = [t.to_dict() for t in self.turns]
        summary = summarize(turns)
        summary["speculation_wasted_ms"] = round(self.wasted_s * 1000, 1)
        summary["cutoffs_recovered"] = self.cutoffs_recovered
        return {
            "call": {"session_id": self.session_id, "transport": self.transport,
                     "duration_s": round(self._audio_t, 3), "ended": self.end_reason,
                     # why the agent hung up: "goodbye", "idle", or an MQTT `hangup` ("operator")
                     "hangup": (self.hangup_why or "operator") if self.hangup_requested.is_set() else None,
                     "transfer": self.transfer},
            "turns": turns,
            "dtmf": self.dtmf,
            "said": self.said,
            "summary": summary,
        }

    # ---------------------------------------------------------------- control

    def push_dtmf(self, digit: str, duration_ms: int = 0) -> None:
        t = self.clock.now()
        self.dtmf.append({"t": round(t, 3), "digit": digit, "duration_ms": duration_ms})
        self.bus.emit(Dtmf(self.session_id, t, digit=digit, duration_ms=duration_ms))

    def set_muted(self, muted: bool) -> None:
        self.muted = muted
        if muted:
            self.output.interrupt()

    def update_budgets(self, values: dict[str, Any]) -> None:
        merged = {**self.budgets.model_dump(), **values}
        try:
            self.budgets = BudgetConfig.model_validate(merged)
        except ValidationError as err:
            raise ConfigError(f"invalid budgets: {format_validation_error(err)}") from None

    # ---------------------------------------------------------------- audio in

    async def push_audio(self, frame: AudioFrame) -> None:
        if self.closed:
            return
        t16 = frame.timestamp
        if frame.sample_rate != ASR_RATE:
            rs = self._resamplers.get(frame.sample_rate)
            if rs is None:
                rs = self._resamplers[frame.sample_rate] = StreamResampler(frame.sample_rate, ASR_RATE)
                self._resampled_t0[frame.sample_rate] = frame.timestamp
            # stamped by the samples the stream has given out, not by the input frame's time:
            # a resampler that holds audio back would otherwise make every VAD time late
            t16 = self._resampled_t0[frame.sample_rate] + rs.emitted / ASR_RATE
            pcm = rs.process(frame.pcm)
        else:
            pcm = frame.pcm
        self._audio_t = frame.end
        self._frame_t = t16  # the preroll ends here: this frame is buffered after the VAD
        if isinstance(self.clock, AudioClock):
            self.clock.t = max(self.clock.t, frame.end)
        self._announce_if_heard()
        self._check_idle()
        if len(pcm) == 0:
            return
        f16 = AudioFrame(pcm, ASR_RATE, t16)
        self._levels.push(t16, pcm, ASR_RATE)
        for ev in self.vad.process(f16):
            if ev.kind == "unvoiced":
                self._unvoiced_ms += self.cfg.vad.frame_ms
                if self._pause_voiced_t is not None and self._in_pause and not self._committed:
                    self._voiced_run_ended_in_pause(self._pause_voiced_t)
            elif ev.kind == "voiced":
                self._unvoiced_ms = 0.0
                self._last_voiced_t = ev.t
            if ev.kind == "start":
                self._on_speech_start(ev.t)
            elif ev.kind == "voiced":
                self._on_voiced(ev.t)
            elif ev.kind == "pause":
                self._on_pause(ev.t)
        if self.utt is not None and not self._committed:
            if self._in_pause:
                # Silence after a pause stays out of the ASR buffer, so the hypothesis started
                # at the pause still covers all the turn's audio; it goes in if speech resumes.
                self._pause_buf.append(pcm)
            else:
                self._flush_pause_audio()
                self.asr.insert_audio(pcm)
            self._maybe_partial()
            self._maybe_endpoint()
        else:
            self._preroll.append(pcm)

    # ---------------------------------------------------------------- turn logic

    def _agent_audible(self) -> bool:
        return self._playing is not None and self.clock.now() < self.output.busy_until()

    def _on_speech_start(self, t: float) -> None:
        self.bus.emit(SpeechStart(self.session_id, t))
        self._speech_run_start = t
        self._caller_spoke(t)
        if self.utt is not None and self._committed and self._may_take_back(t):
            # The caller went on before our reply was heard, or just after it began (they were
            # joining a second sentence, not answering it): the endpoint was premature. Take the
            # reply back (and stop it, if it was playing) and continue the same turn.
            self._take_back()
            self.endpointer.caller_resumed_after((t - self.utt.user_speech_end_s) * 1000, self.utt.transcript)
            self._in_pause = False
            return
        if self.utt is not None and not self._committed:
            if self._in_pause:
                self._caller_resumed(t)
            return  # the same turn goes on
        self._started_over_agent = self._agent_audible() or self._saying()
        self.utt = TurnRecord(index=len(self.turns), user_speech_start_s=t)
        self._committed = False
        self._in_pause = False
        self._last_partial_samples = 0
        self._partial_end = 0.0
        self._partial_cost_s = 0.0
        self._specs.clear()
        self._pause_buf.clear()
        self._last_partial = None
        preroll = list(self._preroll)
        self._preroll.clear()
        pre_s = sum(len(p) for p in preroll) / ASR_RATE
        # The buffer's clock: the preroll is the audio just before the frame being processed,
        # not before ``t`` (the first voiced frame, ``vad.start_ms`` earlier). Off by that much,
        # every hypothesis would seem to miss the caller's last 40 ms of speech.
        self.asr.reset(self._frame_t - pre_s)
        for p in preroll:
            self.asr.insert_audio(p)

    def _may_take_back(self, t: float) -> bool:
        """Caller sound from call time ``t`` makes the committed turn's endpoint premature: the
        reply had not been heard by then, or had only just begun (`_just_heard`)."""
        return not self._reply_audible(t) or self._just_heard(t)

    def _take_back(self) -> None:
        """Withdraw the committed turn's reply (stopping it, if it plays) and reopen the turn."""
        assert self.utt is not None
        self._cancel_response()
        if self._unannounced is self.utt:
            self._unannounced = None  # the turn goes on: not final yet
        if self._playing is self.utt:
            self.output.interrupt()
            self._playing = None
            if self.history and self.history[-1][0] == self.utt.transcript:
                self.history.pop()
        self.utt.response = self.utt.heard_response = ""
        self.utt.agent_audio_start_s = self.utt.agent_audible_s = self.utt.gap_ms = None
        self.utt.stages.clear()
        self.utt.violations.clear()
        self.turns = [x for x in self.turns if x is not self.utt]
        self._committed = False
        self.cutoffs_recovered += 1
        self._restore_held_audio()

    def _restore_held_audio(self) -> None:
        """A committed turn taken back: the audio heard since the commit went to the preroll,
        not the ASR. It goes back in order before the current frame (whatever the preroll no
        longer holds as silence, which it was), so Whisper hears the first syllables of the
        resumed speech and the buffer's clock stays the call's: 80 ms off, no hypothesis
        seemed to cover the caller's last words, and the turn's final transcript ran three
        times over."""
        held = list(self._preroll)
        self._preroll.clear()
        queued = self.asr.audio_end + sum(len(p) for p in self._pause_buf) / ASR_RATE
        missing = self._frame_t - sum(len(p) for p in held) / ASR_RATE - queued
        if missing > 0:
            self._pause_buf.append(np.zeros(int(round(missing * ASR_RATE)), dtype=np.int16))
        self._pause_buf.extend(held)

    def _just_heard(self, t: float) -> bool:
        """The current turn's reply had been audible for under ``turn.takeback_ms`` at call time
        ``t``, and is still the one playing: a caller who speaks now goes on with their turn."""
        utt = self.utt
        return (
            utt is not None and self._playing is utt and utt.agent_audio_start_s is not None
            and t - utt.agent_audio_start_s < self.cfg.turn.takeback_ms / 1000.0
        )

    def _reply_audible(self, t: float) -> bool:
        """Had the caller heard the current turn's reply by call time ``t``?"""
        utt = self.utt
        return utt is not None and utt.agent_audio_start_s is not None and t >= utt.agent_audio_start_s

    def _on_voiced(self, t: float) -> None:
        if self.utt is None:
            return
        frame_start = t - self.cfg.vad.frame_ms / 1000.0
        if self._committed and self.cfg.turn.takeback_on_voiced and self._may_take_back(frame_start):
            # The caller's first voiced frame after a commit, while the reply is unheard or just
            # begun: withdraw it now, not at the VAD's speech start 40 ms later (by then a reply
            # committed as the caller went on was audible: most cut-offs "in speech"). The pause
            # holds, its silence counting from this frame: a lone click re-commits after the
            # rule's wait, speech resumes the turn (`_caller_resumed`).
            self._take_back()
        if self._in_pause and not self._committed:
            # The caller's last syllable, a click on the line, or the start of more speech: the
            # VAD's speech start says which (`_caller_resumed`). Until then the pause holds, and
            # its silence counts from this frame. Ending the pause here, a lone voiced frame
            # left the turn with no pause to end it until the caller spoke again.
            self._pause_voiced_t = t
        elif not self._committed:
            self.utt.user_speech_end_s = t
        run_ms = elapsed_ms(self._speech_run_start if self._speech_run_start is not None else t, t)
        if self.cfg.turn.barge_in and run_ms >= self.cfg.turn.barge_in_min_ms:
            if self._agent_audible() and self._playing is not self.utt:
                self._barge_in(t)
            elif self._saying():
                self._stop_saying(t)

    def _caller_resumed(self, t: float) -> None:
        """The VAD heard speech start at ``t`` inside a pause of the uncommitted turn: the
        caller went on, and the pause is over."""
        assert self.utt is not None
        text = self._pause_text()
        lm_prob = self.turn_end.peek(text)
        near = self.asr.near_next(text) if text is not None else None
        self.endpointer.caller_resumed_after((t - self.utt.user_speech_end_s) * 1000, text, lm_prob, near)
        self._in_pause = False
        self._pause_voiced_t = None
        self.utt.user_speech_end_s = t

    def _voiced_run_ended_in_pause(self, t: float) -> None:
        """Voiced frames inside a pause, ending at ``t``, that never became speech (the turn's
        last syllable after a dip, a click): their audio is the turn's, so it goes to the ASR, and
        the pause starts again after them, with a hypothesis and a Smart Turn opinion that hear
        them. The pause's silence was already counted from ``t``."""
        self._flush_pause_audio()
        self._pause_at(t)

    def _flush_pause_audio(self) -> None:
        """The audio held back since the pause began goes to the ASR, in order."""
        for p in self._pause_buf:
            self.asr.insert_audio(p)
        self._pause_buf.clear()

    def _on_pause(self, t: float) -> None:
        self._speech_run_start = None
        if self.utt is None or self._committed:
            return
        self.bus.emit(SpeechEnd(self.session_id, t))
        self._pause_at(t)

    def _pause_at(self, t: float) -> None:
        assert self.utt is not None
        self.utt.user_speech_end_s = t
        self._in_pause = True
        self._pause_voiced_t = None
        # the pause's sound so far: the turn's audio and the silence since its last word
        self.turn_audio.ask(t, lambda: np.concatenate([self.asr.recent(8.0), *self._pause_buf]))
        if self._started_over_agent and elapsed_ms(self.utt.user_speech_start_s, t) < self.cfg.turn.barge_in_min_ms:
            # a short "uh-huh" over the agent is a backchannel, not a turn
            self.utt = None
            return
        self._speculate()

    def _maybe_partial(self) -> None:
        if self.utt is None:
            return
        n = int(self.asr.duration * ASR_RATE)
        # Partials come every partial_interval_ms of audio, but no more often than twice their
        # own cost: on a long turn each costs more, and the tail partial must find a free worker.
        interval_ms = max(self.cfg.asr.partial_interval_ms, 2000.0 * self._partial_cost_s)
        due = n - self._last_partial_samples >= interval_ms * ASR_RATE / 1000
        # The caller may just have stopped: a partial now covers every voiced frame, so if
        # they have, it is the final transcript, ready before the VAD even reports the pause.
        tail_ms = self.cfg.asr.tail_partial_ms
        tail = (
            tail_ms > 0
            and not self._in_pause
            and self._unvoiced_ms >= tail_ms
            and not covers(self._partial_end, self.utt.user_speech_end_s)
        )
        busy = (self._partial_task is not None and not self._partial_task.done()) or any(
            not s.asr.done() for s in self._specs)
        if busy:
            # One transcription at a time (a partial, or a speculation's at a short pause),
            # except that the tail partial does not wait for one that started before the last
            # voiced frame: with a second ASR worker it runs alongside.
            if not tail or self.cfg.asr.workers < 2:
                return
        elif not (due or tail):
            return
        self._last_partial_samples = n
        self._partial_end = self.asr.audio_end
        # a partial while the caller speaks runs ahead of need; the tail's may be the final one
        self._partial_task = self._spawn(self._partial(AHEAD if not tail else NOW))

    def _covering_partial(self) -> asyncio.Task[None] | None:
        """The partial in flight, if it covers every voiced frame of the turn so far."""
        task = self._partial_task
        if task is None or task.done() or self.utt is None:
            return None
        return task if covers(self._partial_end, self.utt.user_speech_end_s) else None

    async def _partial(self, priority: int) -> None:
        utt = self.utt
        n = int(self.asr.duration * ASR_RATE)
        upd = await self.asr.process_iter(priority)
        self._partial_cost_s = upd.compute_s
        if utt is None or utt is not self.utt or not upd.partial or self._committed:
            return
        if self._last_partial is not None and upd.audio_end < self._last_partial[0]:
            return  # a newer partial (the tail's) finished first
        t = self.clock.now()
        utt.partials.append({"t": round(t, 3), "text": upd.partial, "stable": upd.stable})
        self.bus.emit(Partial(self.session_id, t, text=upd.partial, stable=upd.stable))
        self._last_partial = (upd.audio_end, upd.partial)
        self._note_hypothesis(utt, upd.audio_end)
        self._maybe_cut(utt)
        self.turn_end.get(upd.partial)  # start the LM's opinion now: it is ready if this is the end
        # A partial that already reads as a finished sentence, and hears every voiced frame
        # so far (the caller has not spoken since its audio ended), starts a speculation of its
        # own: if the caller stops here, the reply is ready before the pause is even detected.
        # One the caller has already talked past would be answered for nothing.
        if (
            self.cfg.turn.speculation
            and covers(upd.audio_end, utt.user_speech_end_s)
            and completeness(upd.partial) >= LOOKS_DONE
            and asyncio.current_task() is not self._awaited_by_pause
            and not any(x.text is not None and same_words(x.text, upd.partial) for x in self._specs)
        ):
            self._add_spec(self._spec_for_text(upd.partial, n))
        self._on_evidence()  # a partial covering the speech, its LM opinion known, may end the turn

    def _pause_text(self) -> str | None:
        """The newest hypothesis of the turn so far (it may not cover the last words)."""
        text = self._hypothesis_now()
        if text is None and self._last_partial is not None:
            text = self._last_partial[1]
        return text

    def _maybe_cut(self, utt: TurnRecord) -> None:
        """In a pause, a long turn is cut where the newest hypothesis ends, if that hypothesis
        covers every voiced frame (the cut then falls in silence). Not after a function word:
        Whisper hears the rest of a phrase cut there without its start ("in | his power to do
        for them" came back "It's power to do for them. It is power", "to be | ill disposed" as
        "the oldest,"), and the turn's last words are the ones the endpointer reads. The cut
        then falls at the last earlier pause that was not after one, if any."""
        if utt is self.utt and self._in_pause and not self._committed and self.cfg.asr.segment_after_s > 0:
            self.asr.fix_prefix(self.cfg.asr.segment_after_s, covers_until=utt.user_speech_end_s,
                                where=self._cut_allowed_after)

    def _cut_allowed_after(self, text: str) -> bool:
        """Not after a function word, written or nearly written (`endpointing.NEAR_TRUST`)."""
        return surface_kind(text) != "function_word" and not nearly_function_word(text, self.asr.near_next(text))

    def _hypothesis_now(self) -> str | None:
        """The latest hypothesis that covers all the audio of the current turn."""
        if self._partial_covers_turn():
            return self._last_partial[1] if self._last_partial else None
        for s in reversed(self._specs_on_all_audio()):
            if s.asr.done() and not s.asr.cancelled():
                return s.asr.result()
        return self.asr.peek_cached()

    def _specs_on_all_audio(self) -> list[Speculation]:
        """The speculations whose transcription covers all the audio buffered for the turn."""
        n = int(self.asr.duration * ASR_RATE)
        return [s for s in self._specs if s.samples == n]

    def _covering_asr_in_flight(self) -> bool:
        """A transcription of all the turn's audio so far is running (a partial, or the
        speculation started at the pause)."""
        return self._covering_partial() is not None or any(not s.asr.done() for s in self._specs_on_all_audio())

    def _partial_covers_turn(self) -> bool:
        """The last partial was computed on audio reaching past the last voiced frame, so it
        already is the final transcript (what follows is silence)."""
        return (
            self.utt is not None
            and self._last_partial is not None
            and covers(self._last_partial[0], self.utt.user_speech_end_s)
            and bool(normalize_words(self._last_partial[1]))
        )

    def _maybe_endpoint(self) -> None:
        if self.utt is None or self._committed or not self._in_pause:
            return
        silence_ms = elapsed_ms(max(self.utt.user_speech_end_s, self._pause_voiced_t or 0.0), self._audio_t)
        heard, audio_prob = self.turn_audio.get(self.utt.user_speech_end_s)
        if not heard and silence_ms < self.cfg.turn.max_silence_ms:
            return  # Smart Turn's opinion of this pause is a few ms away
        text = self._hypothesis_now()
        if text is None and self._covering_asr_in_flight() and silence_ms < self.cfg.turn.max_silence_ms:
            # the transcript of all the speech is on its way, and the reply needs it anyway:
            # decide on it rather than on an older partial or on no words (a slow ASR made 300
            # ms waits on stale words here, then the final transcript came after the commit)
            return
        if text is not None:
            known, lm_prob = self.turn_end.get(text)
            if not known and silence_ms < self.cfg.turn.max_silence_ms:
                return  # the LM's opinion is a few ms away
            required = self.endpointer.required_silence_ms(
                text, lm_prob=lm_prob, near=self.asr.near_next(text), audio_prob=audio_prob)
            shortest = self.cfg.turn.min_silence_ms if audio_prob is None else self.cfg.turn.agree_silence_ms
            reason = "complete" if required <= shortest else "incomplete-wait"
        elif self._last_partial is not None:
            # Only an older partial: it is evidence, but it may miss the last words, so it can
            # shorten the wait to the middle ground and no further.
            required = self.endpointer.required_silence_ms(self._last_partial[1], stale=True,
                                                           audio_prob=audio_prob)
            reason = "partial"
        else:
            required = self.endpointer.required_silence_ms(None, audio_prob=audio_prob)
            reason = "no-hypothesis"
        if silence_ms >= required:
            self._commit(silence_ms, "max" if required >= self.cfg.turn.max_silence_ms else reason)
            if text is not None and self.utt is not None:
                self.utt.endpoint["required_ms"] = round(required, 1)
                self.utt.endpoint["lm_turn_end_prob"] = self.turn_end.peek(text)
            if self.utt is not None and audio_prob is not None:
                self.utt.endpoint["smart_turn_prob"] = round(audio_prob, 3)

    def _on_evidence(self) -> None:
        """A hypothesis or the LM's opinion of one has just landed: decide now, not at the next
        audio frame (up to a frame, 20 ms, later; 13 ms on average in the bench)."""
        if not self.closed:
            self._maybe_endpoint()

    def _commit(self, silence_ms: float, reason: str) -> None:
        utt = self.utt
        assert utt is not None
        self._committed = True
        t = self.clock.now()
        utt.endpoint = {"t": round(t, 3), "silence_ms": round(silence_ms, 1), "reason": reason}
        self.bus.emit(EndpointDecision(self.session_id, t, silence_ms=silence_ms, reason=reason))
        self.turns.append(utt)
        self._responding = asyncio.ensure_future(self._respond(utt, t))

    def _barge_in(self, t: float) -> None:
        turn = self._playing
        if turn is None:
            return
        heard_s = self.output.interrupt()
        self._cancel_response()
        self._playing = None
        turn.interrupted = True
        words = turn.response.split()
        before, start = 0, turn.agent_audio_start_s
        if turn.resumed_s is not None:  # cut again, in the part said again after a false interruption
            before, start = self._resume_base, turn.resumed_s
        total_s = (turn.agent_audio_end_s or self.output.busy_until()) - (start or t)
        frac = 1.0 if total_s <= 0 else min(1.0, heard_s / max(total_s, 1e-3))
        turn.heard_response = " ".join(words[: before + int(round(frac * (len(words) - before)))])
        turn.agent_audio_end_s = t
        # the history keeps only what the caller heard
        if self.history and self.history[-1][0] == turn.transcript:
            self.history[-1] = (turn.transcript, turn.heard_response)
        self.bus.emit(Interrupt(self.session_id, t, turn=turn.index, heard_text=turn.heard_response))
        if self._unannounced is not None and self._unannounced is not turn:
            self._announce(self._unannounced, t)
        self._settle_cut()
        if self.cfg.turn.resume_false_interruption and self.utt is not None and self.utt is not turn:
            # final once the caller's words are known: none, and the reply goes on
            self._cut = CutReply(turn, self.utt, len(turn.heard_response.split()))
            if self._unannounced is turn:
                self._unannounced = None
        else:
            self._announce(turn, t)

    def _cancel_response(self) -> None:
        if self._responding is not None and not self._responding.done():
            self._responding.cancel()
        self._responding = None

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        task.add_done_callback(_log_failure)
        return task


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed: %r", task.exception())

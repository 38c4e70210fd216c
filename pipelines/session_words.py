"""The agent's own words outside the caller's turns, and the end of its part of the call: a
greeting as the call starts, prompts to a silent caller and the goodbye before hanging up, an
operator's `say` (MQTT), the hangup after the caller's goodbye has been answered with one, and
the transfer after a reply that hands the caller over.

`OwnWords` is a mixin of `pipelines.session.CallSession`, beside `ReplyPath` (the replies to
the caller's turns). It plays through the same output and stops when the caller talks over it,
as a reply does; it never decides a caller's turn. The settings are `turn.greeting`,
`turn.idle_*`, `turn.end_call_*` and `turn.transfer_to` (docs/turn-taking.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pipelines.closing import is_farewell, is_handoff
from pipelines.events import Interrupt, Transfer

if TYPE_CHECKING:
    from pipelines.config import AgentConfig
    from pipelines.events import EventBus
    from pipelines.report import TurnRecord
    from pipelines.session import Engines
    from pipelines.transport import AudioOutput, Clock


class OwnWords:
    """Mixin of `CallSession`; the state it reads is the session's, declared here."""

    session_id: str
    cfg: AgentConfig
    engines: Engines
    clock: Clock
    output: AudioOutput
    bus: EventBus
    said: list[dict[str, Any]]
    utt: TurnRecord | None
    hangup_requested: asyncio.Event
    transfer_requested: asyncio.Event
    transfer: dict[str, Any] | None
    can_transfer: bool
    transport: str
    _playing: TurnRecord | None
    _committed: bool
    _responding: asyncio.Task[None] | None
    _synth: Callable[..., Awaitable[np.ndarray]]
    _spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]]
    _begin_output: Callable[[int], None]
    _play: Callable[..., float | None]

    def _init_own_words(self) -> None:
        self._say_id = 0  # the newest `say`
        self._say_stopped = 0  # every `say` up to this one was stopped by the caller talking over it
        self._say_until = 0.0  # call time its queued audio ends
        # a silent caller (`turn.idle_prompt_s`)
        self._last_voiced_t = 0.0  # the caller's last voiced frame
        self._idle_mark = 0.0  # call time of the last prompt
        self._idle_prompts = 0  # prompts since the caller last spoke
        self._idle_task: asyncio.Task[None] | None = None
        self._hangup_at: float | None = None  # the agent's part of the call ends here (`_hang_up_at`)
        self.hangup_why: str | None = None  # "idle", "goodbye" (or "transfer", pending) once the agent has decided

    def _greet(self) -> None:
        if self.cfg.turn.greeting:
            self._spawn(self.say(self.cfg.turn.greeting, why="greeting"))

    def _caller_spoke(self, t: float) -> None:
        """The caller's speech started at ``t``: not silent, and not to be hung up on."""
        self._idle_prompts = 0
        if not self.hangup_requested.is_set():
            self._hangup_at = self.hangup_why = None  # a caller who speaks during the goodbye is back

    async def say(self, text: str, why: str = "operator") -> None:
        """Speak ``text`` now, outside any caller turn: an operator's words (``why``), the
        greeting, a prompt to a silent caller. Caller speech over it for `turn.barge_in_min_ms`
        stops it, as it stops a reply."""
        self._say_id += 1
        me = self._say_id
        entry: dict[str, Any] = {"t": round(self.clock.now(), 3), "text": text, "why": why, "audio_start_s": None,
                                 "interrupted": False}
        self.said.append(entry)
        self._begin_output(-1)
        for part in self.engines.tts.split(text):
            pcm = await self._synth(part)
            if self._say_stopped >= me:
                break
            start = self._play(pcm)
            if entry["audio_start_s"] is None and start is not None:
                entry["audio_start_s"] = round(start, 3)
            self._say_until = self.output.busy_until()

    def _saying(self) -> bool:
        """Words of a `say` are playing, and no reply is."""
        return self._playing is None and self._say_stopped < self._say_id and self.clock.now() < self._say_until

    def _stop_saying(self, t: float) -> None:
        """The caller talked over a `say` (the greeting, a prompt): it stops, as a reply would."""
        self._say_stopped = self._say_id
        self._say_until = 0.0
        self.said[-1]["interrupted"] = True
        self.output.interrupt()
        self.bus.emit(Interrupt(self.session_id, t, turn=-1))

    def _check_idle(self) -> None:
        """Every frame: a hangup or transfer decided earlier (`_hang_up_at`) is carried out once
        its time has come (`hangup_requested`, which every transport honours, or
        `request_transfer`). A caller silent for `turn.idle_prompt_s` since anybody last spoke
        is asked whether they are still there; after `turn.idle_hangup_after` such prompts the
        agent says goodbye and, once that has played, hangs up."""
        if self.hangup_requested.is_set():
            return
        now = self.clock.now()
        if self._hangup_at is not None:
            if now < self._hangup_at:
                return
            self._hangup_at = None
            if self.hangup_why == "transfer" and self.cfg.turn.transfer_to is not None:
                self.hangup_why = None
                self.request_transfer(self.cfg.turn.transfer_to, "handoff")
            else:
                self.hangup_requested.set()
            return
        turn = self.cfg.turn
        if turn.idle_prompt_s is None:
            return
        if self.utt is not None and not self._committed:
            return  # the caller's turn goes on
        busy = [self._responding, self._idle_task]
        if any(task is not None and not task.done() for task in busy):
            return
        if now - max(self._last_voiced_t, self.output.busy_until(), self._idle_mark) < turn.idle_prompt_s:
            return
        self._idle_mark = now
        self._idle_prompts += 1
        if turn.idle_hangup_after and self._idle_prompts > turn.idle_hangup_after:
            self._idle_task = self._spawn(self._say_goodbye())
        else:
            self._idle_task = self._spawn(self.say(turn.idle_prompt_text, why="idle"))

    async def _say_goodbye(self) -> None:
        await self.say(self.cfg.turn.idle_goodbye_text, why="goodbye")
        if self._idle_prompts:  # nobody has spoken since the prompts (a speech start resets them)
            self._hang_up_at(max(self.clock.now(), self.output.busy_until()), "idle")

    def _closing_said(self, turn: TurnRecord) -> None:
        """``turn``'s reply is all queued. If the caller said goodbye and the reply is one too
        (`pipelines.closing`), the agent hangs up `turn.end_call_grace_ms` after it has played;
        if the reply hands the caller over and `turn.transfer_to` names where, the call is
        transferred once it has played. Either is called off if the caller speaks before then
        (`_caller_spoke`); a reply the caller cut off ends nothing."""
        cfg = self.cfg.turn
        if turn.interrupted or turn.agent_audio_end_s is None:
            return
        if cfg.transfer_to is not None and is_handoff(turn.response):
            self._hang_up_at(turn.agent_audio_end_s, "transfer")
        elif cfg.end_call_on_goodbye and is_farewell(turn.transcript) and is_farewell(turn.response):
            self._hang_up_at(turn.agent_audio_end_s + cfg.end_call_grace_ms / 1000, "goodbye")

    def _hang_up_at(self, t: float, why: str) -> None:
        """End the agent's part of the call at call time ``t``: hang up, or for ``why``
        "transfer" hand the call to `turn.transfer_to`."""
        self._hangup_at = t
        self.hangup_why = why

    def request_transfer(self, to: str, why: str = "operator") -> None:
        """Ask the transport to transfer the call to ``to`` (a SIP URI) now: the agent's
        handoff, or an operator's MQTT `transfer`. A transport that can (SIP, which sets
        `can_transfer`) answers with `transfer_done`; with any other the call goes on, and
        the report says why."""
        self.transfer = {"to": to, "why": why, "t": round(self.clock.now(), 3), "result": None}
        self.bus.emit(Transfer(self.session_id, self.clock.now(), to=to, why=why))
        if not self.can_transfer:
            self.transfer_done(f"unsupported: {self.transport} calls cannot be transferred")
            return
        self.transfer_requested.set()

    def transfer_done(self, result: str) -> None:
        """The transport's answer to `request_transfer`: ``transferred``, or why not (the
        call goes on, and a later handoff may ask again)."""
        if self.transfer is not None:
            self.transfer["result"] = result
            self.bus.emit(Transfer(self.session_id, self.clock.now(), to=self.transfer["to"],
                                   why=self.transfer["why"], result=result))
        self.transfer_requested.clear()

"""Typed events a call session emits, and the bus that fans them out.

Stages never call back into earlier stages; anything that flows backwards (interruption,
hang-up, DTMF, budget violations) is one of these events. Subscribers (the report, MQTT,
Prometheus, the WebRTC page) each get their own bounded queue, so a slow subscriber can
never block the audio path: when its queue is full the event is dropped *for that
subscriber* and counted.

The `Event` base (and `SCHEMA_VERSION`) live in `voice.events`, where the transports that
forward events can reach them; both names stay importable from here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from voice.events import SCHEMA_VERSION as SCHEMA_VERSION
from voice.events import Event


@dataclass
class SessionStart(Event):
    transport: str = "replay"
    kind: str = field(init=False, default="session/start")


@dataclass
class SessionEnd(Event):
    reason: str = "completed"
    turns: int = 0
    kind: str = field(init=False, default="session/end")


@dataclass
class SpeechStart(Event):
    kind: str = field(init=False, default="speech_start")


@dataclass
class SpeechEnd(Event):
    """The caller paused: ``t`` is the end of the last voiced frame."""

    kind: str = field(init=False, default="speech_end")


@dataclass
class Partial(Event):
    text: str = ""
    stable: str = ""
    kind: str = field(init=False, default="partial")


@dataclass
class SpeculationStarted(Event):
    text: str = ""
    kind: str = field(init=False, default="speculation")


@dataclass
class EndpointDecision(Event):
    silence_ms: float = 0.0
    reason: str = ""
    kind: str = field(init=False, default="endpoint")


@dataclass
class Violation(Event):
    stage: str = ""
    budget_ms: float = 0.0
    actual_ms: float = 0.0
    over_ms: float = 0.0
    turn: int = 0
    kind: str = field(init=False, default="violation")


@dataclass
class LlmError(Event):
    """A request to the LM failed (``llm.backend: openai``); ``error`` is the fault's kind (see
    `llm.remote_errors`). On the committed path the turn's reply is the fallback."""

    error: str = ""
    message: str = ""
    status: int | None = None
    turn: int = 0
    speculative: bool = False
    kind: str = field(init=False, default="llm_error")


@dataclass
class Interrupt(Event):
    turn: int = 0
    heard_text: str = ""
    kind: str = field(init=False, default="interrupt")


@dataclass
class Transfer(Event):
    """The call is being handed on to ``to`` (``why``: ``handoff``, the agent's reply said so,
    or ``operator``); sent when asked (``result`` None) and again with the transport's answer
    (``transferred``, or why not, and then the call goes on)."""

    to: str = ""
    why: str = ""
    result: str | None = None
    kind: str = field(init=False, default="transfer")


@dataclass
class Resume(Event):
    """A false interruption: the barge-in's sound had no words, so the agent goes on with the
    reply it cut, from the start of the sentence the caller was cut off in (``text``)."""

    turn: int = 0
    text: str = ""
    kind: str = field(init=False, default="resume")


@dataclass
class Dtmf(Event):
    digit: str = ""
    duration_ms: int = 0
    kind: str = field(init=False, default="dtmf")


@dataclass
class CacheState(Event):
    """The reply cache's backend went down (the call goes on uncached) or came back."""

    backend: str = ""
    available: bool = True
    error: str = ""
    kind: str = field(init=False, default="cache")


@dataclass
class TurnCompleted(Event):
    """One caller turn and the agent's reply; ``report`` is the turn's report dict."""

    report: dict[str, Any] = field(default_factory=dict)
    kind: str = field(init=False, default="turn")


class EventBus:
    """Non-blocking fan-out. ``emit`` never awaits and never raises."""

    def __init__(self) -> None:
        self._subs: list[tuple[asyncio.Queue[Event], list[int]]] = []
        self._sync: list[Any] = []

    def subscribe(self, maxsize: int = 1000) -> tuple[asyncio.Queue[Event], list[int]]:
        """An async subscriber: a queue and a one-element drop counter."""
        q: asyncio.Queue[Event] = asyncio.Queue(maxsize)
        dropped = [0]
        self._subs.append((q, dropped))
        return q, dropped

    def unsubscribe(self, q: asyncio.Queue[Event]) -> None:
        self._subs = [s for s in self._subs if s[0] is not q]

    def add_listener(self, fn: Any) -> None:
        """A synchronous listener, called inline; it must be cheap (a counter, a list append)."""
        self._sync.append(fn)

    def emit(self, event: Event) -> None:
        for fn in self._sync:
            try:
                fn(event)
            except Exception:  # a broken listener must not break the call
                pass
        for q, dropped in self._subs:
            try:
                q.put_nowait(event)
            except asyncio.QueueFull:
                dropped[0] += 1

"""The contract between a transport (replay, SIP, WebRTC, LiveKit) and a call session.

A transport owns the wire. It turns the caller's audio into `AudioFrame`s stamped on the
call timeline and pushes them into the session; the session writes the agent's audio into
the transport's `AudioOutput`, which paces it to the caller. Nothing else crosses.

    transport --AudioFrame--> CallSession --pcm--> AudioOutput --wire--> caller
                                   |
                                EventBus (turns, partials, violations, dtmf ...)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on the call timeline."""
        ...


class RealtimeClock:
    """Call time = wall time since the call started (every live transport, real-time replay)."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0


class AudioClock:
    """Call time = end of the caller audio fed so far (``--fast`` replay: compute is free)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


@runtime_checkable
class AudioOutput(Protocol):
    """Where the agent's voice goes.

    `play` queues int16 mono PCM at `sample_rate` and returns at once with the call time at
    which its first sample reaches the caller (queueing and output buffering included).
    `interrupt` drops everything queued (barge-in) and returns the seconds of agent audio the
    caller actually heard since the last `begin_turn`. `busy_until` is the call time at which
    queued audio will have finished playing.
    """

    sample_rate: int

    def begin_turn(self, turn: int) -> None: ...

    def play(self, pcm: np.ndarray) -> float: ...

    def interrupt(self) -> float: ...

    def busy_until(self) -> float: ...


@dataclass(frozen=True)
class Refusal:
    """Why the agent takes no more calls now (`pipelines.admission`): ``busy`` at capacity
    (SIP 486), else overloaded (SIP/HTTP 503); either way retry after ``retry_after_s``."""

    busy: bool
    retry_after_s: int
    detail: str

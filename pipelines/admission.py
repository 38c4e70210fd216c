"""Admission: one capacity of live calls shared by every transport of an agent, and a refusal
when the box is overloaded.

A transport asks `Admission.admit` before it answers a call. It gets a `Seat` (held until the
call's session closes) or a `Refusal`: *busy* (``agent.max_calls`` calls are live: SIP 486,
HTTP 503) or *overloaded* (the event loop has lagged more than ``agent.overload_lag_ms`` in
the last ``agent.overload_window_s``, or more engine jobs wait than ``agent.overload_queue``:
SIP 503 and HTTP 503, both with Retry-After). A call is refused before any work is done for
it, so it is never half-served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pydantic import Field

from pipelines.loop_lag import LoopLagMonitor
from voice.settings import Section
from voice.transports.base import Refusal

log = logging.getLogger(__name__)


class CapacityConfig(Section):
    """The agent's ``agent:`` section: how many calls one box takes."""

    max_calls: int = Field(4, ge=1, le=1000, description="live calls on this agent, every transport together")
    overload_lag_ms: float = Field(
        250.0, ge=1, le=60000, description="event-loop lag (worst in overload_window_s) above which new calls get 503")
    overload_window_s: float = Field(2.0, gt=0, le=600, description="how far back the loop lag is remembered")
    overload_queue: int = Field(
        8, ge=1, le=10000, description="engine jobs waiting for a worker thread above which new calls get 503")
    retry_after_s: int = Field(5, ge=1, le=3600, description="Retry-After sent with a refusal")
    engine_pools: bool = Field(
        True, description="each engine runs on its own bounded pool of worker threads; false: all share asyncio's "
                          "default executor")
    engine_threads: int = Field(0, ge=0, le=64, description="worker threads per engine pool; 0: one per core")


class Seat:
    """One admitted call's place; `release` is idempotent."""

    def __init__(self, admission: Admission, transport: str) -> None:
        self._admission = admission
        self.transport = transport
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._admission._released(self)


class Admission:
    def __init__(self, cfg: CapacityConfig, queue_depth: Callable[[], int] | None = None) -> None:
        self.cfg = cfg
        self.lag = LoopLagMonitor(cfg.overload_window_s)
        self.queue_depth = queue_depth or (lambda: 0)
        self.live = 0
        self.refused = {"busy": 0, "overloaded": 0}

    def admit(self, transport: str) -> Seat | Refusal:
        """A seat for one more call, or why not. Call from the event loop."""
        self.lag.ensure_running()
        if self.live >= self.cfg.max_calls:
            return self._refuse(True, f"busy: {self.live} calls in progress (max {self.cfg.max_calls})")
        lag_ms = self.lag.worst_ms()
        if lag_ms > self.cfg.overload_lag_ms:
            return self._refuse(False, f"overloaded: event loop lagged {lag_ms:.0f} ms "
                                       f"(bound {self.cfg.overload_lag_ms:.0f} ms)")
        depth = self.queue_depth()
        if depth > self.cfg.overload_queue:
            return self._refuse(False, f"overloaded: {depth} engine jobs waiting (bound {self.cfg.overload_queue})")
        return self.take(transport)

    def take(self, transport: str) -> Seat:
        """A seat without asking (a replayed call): counted, never refused."""
        self.live += 1
        return Seat(self, transport)

    def load(self) -> float:
        """Live calls as a fraction of capacity (LiveKit's worker load)."""
        return self.live / self.cfg.max_calls

    async def aclose(self) -> None:
        await self.lag.aclose()

    def _refuse(self, busy: bool, detail: str) -> Refusal:
        self.refused["busy" if busy else "overloaded"] += 1
        log.info("call refused: %s", detail)
        return Refusal(busy=busy, retry_after_s=self.cfg.retry_after_s, detail=detail)

    def _released(self, seat: Seat) -> None:
        self.live -= 1

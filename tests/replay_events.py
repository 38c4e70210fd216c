"""A call replayed through an agent (`replay --fast`), with every event its bus sent."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipelines.events import Event
from pipelines.replay import replay_pcm


async def replay_with_events(agent: Any, pcm: np.ndarray, rate: int) -> tuple[dict, np.ndarray, list[Event]]:
    """The report, the agent's track and the bus's events of ``pcm`` replayed as one call."""
    events: list[Event] = []
    agent.bus.add_listener(events.append)
    report, track = await replay_pcm(agent, pcm, rate, fast=True)
    return report, track, events

"""The base of the typed events a call session emits.

Transports forward events to the caller's side (the WebRTC data channel, LiveKit data
packets) without knowing their kinds; the kinds themselves and the bus that fans them out
are in `pipelines.events`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class Event:
    session_id: str
    t: float  # seconds on the call timeline
    kind: str = field(init=False, default="event")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["type"] = self.kind
        d["version"] = SCHEMA_VERSION
        d["wall_time"] = time.time()
        return d

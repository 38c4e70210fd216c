"""The base of the typed events a call session emits.

Transports forward events to the caller's side (the WebRTC data channel, LiveKit data
packets) without knowing their kinds; the kinds themselves and the bus that fans them out
are in `pipelines.events`.
"""

from __future__ import annotations

import json
import math
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


def to_json(payload: dict[str, Any]) -> str:
    """Compact JSON for an event's dict (or any payload sent beside events).

    JSON has no NaN or Infinity (a browser's ``JSON.parse`` rejects them): they go as null.
    numpy scalars and arrays go as numbers and lists; anything else as its ``str``.
    """
    return json.dumps(_finite(payload), default=str, allow_nan=False, separators=(",", ":"))


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    if hasattr(x, "tolist") and hasattr(x, "dtype"):  # numpy scalar or array: checked as numbers
        return _finite(x.tolist())
    return x

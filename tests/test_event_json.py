"""Events leave the process as JSON that a browser's JSON.parse and an MQTT client accept.

The WebRTC data channel, LiveKit data packets and MQTT all send `voice.events.to_json`: a
turn report can hold NaN (a stage that did not run) and numpy numbers (levels, probabilities).
"""

from __future__ import annotations

import json

import numpy as np

from pipelines.events import EndpointDecision, TurnCompleted
from pipelines.mqtt import encode
from voice.events import to_json
from voice.transports.webrtc import event_json


def _strict_loads(text: str) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinity_go_as_null_and_numpy_as_numbers() -> None:
    report = {
        "gap_ms": float("nan"),
        "stage_ms": {"tts": float("inf"), "asr": np.float32(12.5)},
        "levels": np.array([1.0, np.nan]),
        "probs": (np.float64(0.25), -float("inf")),
        "turn": np.int64(3),
        "ok": True,
        "text": "done",
    }
    event = TurnCompleted(session_id="s1", t=1.5, report=report)
    for text in (to_json(event.to_dict()), event_json(event), encode(event.to_dict()).decode()):
        d = _strict_loads(text)
        assert isinstance(d, dict)
        r = d["report"]
        assert r["gap_ms"] is None
        assert r["stage_ms"] == {"tts": None, "asr": 12.5}
        assert r["levels"] == [1.0, None]
        assert r["probs"] == [0.25, None]
        assert r["turn"] == 3 and r["ok"] is True and r["text"] == "done"
        assert d["type"] == "turn" and d["session_id"] == "s1"


def test_compact_and_unknown_objects_as_text() -> None:
    event = EndpointDecision(session_id="s2", t=0.25, silence_ms=380.0, reason="complete")
    text = to_json(event.to_dict())
    assert ", " not in text and ": " not in text

    class Where:
        def __str__(self) -> str:
            return "here"

    assert _strict_loads(to_json({"path": Where()})) == {"path": "here"}

"""Per-turn records and the call report (REPORT.json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pipelines.budgets import STAGES


@dataclass
class TurnRecord:
    index: int
    user_speech_start_s: float
    user_speech_end_s: float = 0.0
    transcript: str = ""
    partials: list[dict[str, Any]] = field(default_factory=list)
    response: str = ""
    heard_response: str = ""
    agent_audio_start_s: float | None = None
    agent_audio_end_s: float | None = None
    # the gap as the caller hears it: from the estimated last audible caller sample
    # (``speech_end_s``, before the VAD's ``user_speech_end_s``) to the reply's first audible
    # sample (``agent_audible_s``, after ``agent_audio_start_s``, the first sample played);
    # ``vad_gap_ms`` runs between the VAD's end and the first sample played
    gap_ms: float | None = None
    speech_end_s: float | None = None
    agent_audible_s: float | None = None
    vad_gap_ms: float | None = None
    interrupted: bool = False
    resumed_s: float | None = None  # a false interruption: when the cut reply went on again
    speculation: dict[str, Any] = field(default_factory=lambda: {"used": False, "hit": False, "started": [],
                                                                  "wasted_ms": 0.0, "warm_starts": 0})
    endpoint: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)
    llm_step_times_s: list[float] = field(default_factory=list)
    # the reply cache: state hit | miss | unavailable | uncacheable (+ reason) | off; stored
    cache: dict[str, Any] = field(default_factory=lambda: {"state": "off", "lookup_ms": 0.0, "stored": False})
    first_audio: str = "content"  # or "fallback"
    first_content_audio_s: float | None = None
    violations: list[dict[str, Any]] = field(default_factory=list)
    llm_requests: int = 0  # LM calls for this turn, speculative ones included
    llm_error: str | None = None  # the committed reply's LM fault (its kind), if the fallback replaced it

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("user_speech_start_s", "user_speech_end_s", "agent_audio_start_s", "agent_audio_end_s",
                  "first_content_audio_s", "speech_end_s", "agent_audible_s", "resumed_s"):
            if d[k] is not None:
                d[k] = round(d[k], 3)
        if d["gap_ms"] is not None:
            d["gap_ms"] = round(d["gap_ms"], 1)
        d["stages"] = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in d["stages"].items()}
        return d


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(turns: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = [t["gap_ms"] for t in turns if t.get("gap_ms") is not None]
    spec = [t["speculation"] for t in turns if t["speculation"].get("used")]
    hits = sum(1 for s in spec if s.get("hit"))
    cache = [(t.get("cache") or {}).get("state") for t in turns]
    looked_up = [c for c in cache if c in ("hit", "miss", "unavailable")]
    stage_medians = {}
    for s in (*STAGES, "llm_steps"):
        vals = [t["stages"][s] for t in turns if s in t.get("stages", {})]
        if vals:
            stage_medians[s] = round(float(np.median(vals)), 1)
    return {
        "turns": len(turns),
        "answered": sum(1 for t in turns if t.get("agent_audio_start_s") is not None),
        "gap_p50_ms": _r(percentile(gaps, 50)),
        "gap_p95_ms": _r(percentile(gaps, 95)),
        "violations": sum(len(t.get("violations", [])) for t in turns),
        "interrupted": sum(1 for t in turns if t.get("interrupted")),
        "resumed": sum(1 for t in turns if t.get("resumed_s") is not None),
        "speculation_hit_rate": round(hits / len(spec), 3) if spec else None,
        "speculation_wasted_ms": round(sum(t["speculation"].get("wasted_ms", 0.0) for t in turns), 1),
        "fallbacks": sum(1 for t in turns if t.get("first_audio") == "fallback"),
        "llm_requests_per_turn": round(sum(t.get("llm_requests", 0) for t in turns) / len(turns), 2) if turns else None,
        "llm_errors": sum(1 for t in turns if t.get("llm_error")),
        "cache_hits": looked_up.count("hit"),
        "cache_hit_rate": round(looked_up.count("hit") / len(looked_up), 3) if looked_up else None,
        "stage_p50_ms": stage_medians,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)

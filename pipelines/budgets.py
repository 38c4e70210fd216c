"""Per-stage latency budgets: which stage of a turn overran its share of the turn gap.

The turn gap is split into five stages, each with a budget in `BudgetConfig` (config.yaml
``budgets``), summing to at most ``target_gap_ms``. A stage over its budget is a violation:
the session emits it as a `Violation` event and counts it in the report, never silently.
"""

from __future__ import annotations

from typing import Any

from pipelines.config import BudgetConfig

STAGES = ("vad_endpoint", "asr_final", "llm_block", "tts_first_audio", "output")
# the BudgetConfig field that holds each stage's budget
BUDGET_KEYS = {
    "vad_endpoint": "endpoint_ms",
    "asr_final": "asr_final_ms",
    "llm_block": "llm_block_ms",
    "tts_first_audio": "tts_first_audio_ms",
    "output": "output_ms",
}


def stage_violations(stages: dict[str, float], budgets: BudgetConfig) -> list[dict[str, Any]]:
    """One record per stage whose measured ms exceed its budget (a missing stage took 0 ms), at
    the 0.1 ms the report gives: a stage 0.04 ms over is not reported as "over by 0.0 ms"."""
    out = []
    for stage in STAGES:
        budget = getattr(budgets, BUDGET_KEYS[stage])
        actual = round(stages.get(stage, 0.0), 1)
        if actual > budget:
            out.append({"stage": stage, "budget_ms": budget, "actual_ms": actual,
                        "over_ms": round(actual - budget, 1)})
    return out

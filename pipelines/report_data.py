"""A call report as the report's table and plot both read it: loading and checking the
file, the stage budgets that applied to each turn, and the stages' names and colours.

`pipelines.report_view` (the table and the ``voice-agent report`` command) and
`pipelines.report_plot` (the timeline picture) both build on this module, and neither on
the other's internals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.budgets import BUDGET_KEYS
from pipelines.config import BudgetConfig

STAGE_LABELS = {
    "vad_endpoint": "end of turn",
    "asr_final": "ASR final",
    "llm_block": "LLM block",
    "tts_first_audio": "TTS first audio",
    "output": "output",
}
STAGE_COLORS = {
    "vad_endpoint": "#4C72B0",
    "asr_final": "#8172B2",
    "llm_block": "#DD8452",
    "tts_first_audio": "#55A868",
    "output": "#937860",
}
OVER = "#D62728"


class ReportError(ValueError):
    """The report file cannot be read or is not a call report."""


def load_report(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ReportError(f"report not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"cannot read {p}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{p} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise ReportError(f"{p} is not a call report: no turns[] list (write one with `voice-agent replay`)")
    if not all(isinstance(t, dict) for t in data["turns"]):
        raise ReportError(f"{p}: every element of turns[] must be an object")
    return data


def budgets_of(report: dict[str, Any]) -> dict[str, float]:
    """Stage budgets in ms, plus ``target``: the call's config if the report has it, else the defaults."""
    cfg = ((report.get("call") or {}).get("config") or {}).get("budgets")
    try:
        b = BudgetConfig.model_validate(cfg) if isinstance(cfg, dict) else BudgetConfig()
    except ValueError:
        b = BudgetConfig()
    out = {stage: float(getattr(b, key)) for stage, key in BUDGET_KEYS.items()}
    out["target"] = float(b.target_gap_ms)
    return out


def turn_budgets(turn: dict[str, Any], budgets: dict[str, float]) -> dict[str, float]:
    """A budget changed mid-call (MQTT config/budgets) shows in the turn's own violations."""
    out = dict(budgets)
    for v in turn.get("violations") or []:
        if isinstance(v, dict) and v.get("stage") in out and _num(v.get("budget_ms")) is not None:
            out[v["stage"]] = float(v["budget_ms"])
    return out


def cache_note(turn: dict[str, Any]) -> str | None:
    """What the reply cache did for a turn, in a few words (None: no cache, or nothing to say)."""
    c = turn.get("cache") or {}
    state = c.get("state")
    if state == "hit":
        return f"reply from the cache ({_num(c.get('lookup_ms')) or 0:.1f} ms lookup): no LM, no TTS"
    if state == "unavailable":
        return "cache backend down: answered uncached"
    if state == "uncacheable" and c.get("reason"):
        return f"not cached: {c['reason']}"
    return None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _short(text: Any, n: int = 60) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= n else s[: n - 1] + "…"

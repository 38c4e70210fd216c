"""The timeline picture of a call report (matplotlib, no display needed).

See pipelines/report_view.py for what it shows. Times in the per-turn panels are ms from
the end of the caller's speech as the VAD saw it, so the agent's audio starts at
x = vad_gap_ms and the dotted red line is the target; titles also give gap_ms, the gap as
the caller hears it (from the last audible caller sound to the first audible agent sound).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from pipelines.budgets import STAGES  # noqa: E402
from pipelines.report_data import (  # noqa: E402
    OVER,
    STAGE_COLORS,
    STAGE_LABELS,
    _num,
    _short,
    budgets_of,
    turn_budgets,
)

LANES = ("caller", "partials", "speculation", *STAGES, "LLM steps", "agent")
COMPRESS = 8.0  # how much the time outside the gap window is squeezed
CALLER, AGENT, SPEC, PARTIAL = "#7F7F7F", "#2CA02C", "#9467BD", "#17BECF"


def plot_timeline(report: dict[str, Any], path: str | Path, max_turns: int = 6) -> Path:
    turns = report.get("turns") or []
    budgets = budgets_of(report)
    shown = turns[:max_turns]
    top_h = 1.2 + 0.32 * (len(turns) + 1)
    heights = [top_h] + [3.0] * len(shown)
    fig, axes = plt.subplots(
        len(heights), 1, figsize=(13, sum(heights) + 0.6), gridspec_kw={"height_ratios": heights}, squeeze=False
    )
    call = report.get("call") or {}
    fig.suptitle(
        f"call {call.get('session_id', '?')} ({call.get('transport', '?')}) · {Path(str(call.get('input', ''))).name}",
        fontsize=12,
        fontweight="bold",
    )
    _budget_bars(axes[0][0], turns, budgets)
    for ax, turn in zip((a[0] for a in axes[1:]), shown, strict=True):
        _waterfall(ax, turn, turn_budgets(turn, budgets))
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _budget_bars(ax: Axes, turns: list[dict[str, Any]], budgets: dict[str, float]) -> None:
    """Each turn's stages stacked left to right, under the budget allocation: who overran?"""
    rows: list[tuple[str, dict[str, float], dict[str, float], float | None]] = [
        ("budget", {s: budgets[s] for s in STAGES}, budgets, None)
    ]
    for t in turns:
        stages = {s: v for s in STAGES if (v := _num((t.get("stages") or {}).get(s))) is not None}
        rows.append((f"turn {t.get('index', '?')}", stages, turn_budgets(t, budgets), _heard_gap(t)))
    xmax = budgets["target"]
    for y, (label, stages, b, gap) in enumerate(rows):
        left = 0.0
        for s in STAGES:
            ms = stages.get(s)
            if ms is None:
                continue
            over = label != "budget" and ms > b[s]
            ax.barh(
                y,
                ms,
                left=left,
                height=0.62,
                color=STAGE_COLORS[s],
                alpha=0.35 if label == "budget" else 1.0,
                edgecolor=OVER if over else "white",
                linewidth=2.0 if over else 0.6,
                hatch="///" if over else None,
            )
            if over and ms - b[s] >= 0.04 * max(xmax, 1):
                ax.text(
                    left + ms / 2,
                    y,
                    _over(ms - b[s]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white",
                    fontweight="bold",
                )
            left += ms
        xmax = max(xmax, left)
        if label != "budget":
            note = "no reply" if gap is None else f"heard gap {gap:.0f} ms"
            ax.text(left, y, f"  {note}", va="center", fontsize=8, color=OVER if gap and gap > b["target"] else "k")
    ax.axvline(budgets["target"], color=OVER, linestyle=":", linewidth=1.5)
    ax.text(budgets["target"], -0.75, f" target {budgets['target']:.0f} ms", color=OVER, fontsize=8, va="bottom")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.4, -0.9)
    ax.set_xlim(0, xmax * 1.18)
    ax.set_xlabel("ms from the end of caller speech to the first agent audio (stages stacked; hatched: over budget)")
    ax.legend(
        handles=[Patch(color=STAGE_COLORS[s], label=STAGE_LABELS[s]) for s in STAGES],
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        ncol=len(STAGES),
        frameon=False,
    )
    ax.grid(axis="x", alpha=0.3)


def _focus_scale(lo: float, hi: float) -> tuple[Any, Any]:
    """Linear inside [lo, hi], COMPRESS times denser outside: the gap stays readable."""

    def fwd(x: Any) -> Any:
        x = np.asarray(x, dtype=float)
        return np.where(x < lo, lo + (x - lo) / COMPRESS, np.where(x > hi, hi + (x - hi) / COMPRESS, x))

    def inv(y: Any) -> Any:
        y = np.asarray(y, dtype=float)
        return np.where(y < lo, lo + (y - lo) * COMPRESS, np.where(y > hi, hi + (y - hi) * COMPRESS, y))

    return fwd, inv


def _nice_step(span_ms: float) -> float:
    for step in (10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000):
        if span_ms / step <= 8:
            return step
    return 10000


def _waterfall(ax: Axes, turn: dict[str, Any], budgets: dict[str, float]) -> None:
    y = {lane: i for i, lane in enumerate(LANES)}
    end_s = _num(turn.get("user_speech_end_s")) or 0.0

    def rel(t: Any) -> float | None:
        v = _num(t)
        return None if v is None else (v - end_s) * 1000.0

    start = rel(turn.get("user_speech_start_s"))
    agent_start, agent_end = rel(turn.get("agent_audio_start_s")), rel(turn.get("agent_audio_end_s"))
    gap = _axis_gap(turn)
    heard = _heard_gap(turn)
    stages = turn.get("stages") or {}
    spec = turn.get("speculation") or {}
    spec_starts = [r for s in spec.get("started") or [] if isinstance(s, dict) and (r := rel(s.get("t"))) is not None]
    stage_total = sum(v for s in STAGES if (v := _num(stages.get(s))) is not None)

    # The linear window: from a little before the pause (speculation starts there) to just
    # past the later of the target and the first agent audio.
    lo = min([-150.0, *[s - 40 for s in spec_starts if s > -1500]])
    hi = max(budgets["target"], gap or 0.0, stage_total, agent_start or 0.0) + 80.0
    left = min(lo, (start or lo) - 100)
    right = max(hi, (agent_end or hi) + 100)
    fwd, inv = _focus_scale(lo, hi)
    ax.set_xscale("function", functions=(fwd, inv))
    ax.set_xlim(left, right)
    for a, b in ((left, lo), (hi, right)):
        if b > a:
            ax.axvspan(a, b, color="#EEEEEE", zorder=0)
            ax.text((a + b) / 2, -0.85, f"×1/{COMPRESS:.0f}", ha="center", va="center", fontsize=7, color="#777777")

    # caller speech, partials, speculation
    if start is not None:
        ax.barh(y["caller"], -start, left=start, height=0.6, color=CALLER)
        ax.text(
            start,
            y["caller"],
            f" {_short(turn.get('transcript'), 70)}",
            va="center",
            fontsize=8,
            color="white",
            clip_on=True,
        )
    partial_ts = [r for p in turn.get("partials") or [] if isinstance(p, dict) and (r := rel(p.get("t"))) is not None]
    ax.plot(partial_ts, [y["partials"]] * len(partial_ts), "|", color=PARTIAL, markersize=12, markeredgewidth=2)
    hit = bool(spec.get("hit"))
    for i, s in enumerate(spec_starts):
        last = i == len(spec_starts) - 1
        ax.plot([s], [y["speculation"]], ">", color=AGENT if (hit and last) else SPEC, markersize=8)
    if spec_starts:
        verdict = "hit" if hit else "miss" if spec.get("used") else ""
        ax.text(spec_starts[-1], y["speculation"], f"   {verdict}", va="center", fontsize=8)

    # the stages as a waterfall, each with its budget outlined from the same start
    t = 0.0
    for s in STAGES:
        ms = _num(stages.get(s))
        if ms is None:
            continue
        over = ms > budgets[s]
        ax.barh(y[s], budgets[s], left=t, height=0.8, fill=False, edgecolor="#555555", linestyle="--", linewidth=0.8)
        ax.barh(
            y[s],
            max(ms, 0.5),
            left=t,
            height=0.55,
            color=STAGE_COLORS[s],
            hatch="///" if over else None,
            edgecolor=OVER if over else STAGE_COLORS[s],
            linewidth=1.8 if over else 0.5,
        )
        label = f" {ms:.0f} ms" + (f" ({_over(ms - budgets[s])})" if over else "")
        ax.text(
            t + max(ms, budgets[s]),
            y[s],
            label,
            va="center",
            fontsize=8,
            color=OVER if over else "k",
            fontweight="bold" if over else None,
        )
        t += ms
    _llm_steps(ax, turn, y["LLM steps"], stages, hit, rel)

    # endpoint decision, first audio, playback, target
    ep = turn.get("endpoint") or {}
    ep_t = rel(ep.get("t"))
    if ep_t is not None:
        ax.axvline(ep_t, color="k", linestyle="--", linewidth=1)
        ax.text(ep_t, len(LANES) - 0.35, f" endpoint: {ep.get('reason', '')}", fontsize=8, va="center")
    if agent_start is not None:
        end = agent_end if agent_end is not None and agent_end > agent_start else agent_start + 1
        ax.barh(y["agent"], end - agent_start, left=agent_start, height=0.6, color=AGENT)
        ax.text(
            agent_start,
            y["agent"],
            f" {_short(turn.get('heard_response') or turn.get('response'), 70)}",
            va="center",
            fontsize=8,
            color="white",
            clip_on=True,
        )
        if turn.get("interrupted"):
            ax.plot([end], [y["agent"]], "X", color=OVER, markersize=10)
            ax.text(end, y["agent"], "  barge-in", va="center", fontsize=8, color=OVER)
    ax.axvline(budgets["target"], color=OVER, linestyle=":", linewidth=1.5)
    ax.axvline(0, color=CALLER, linewidth=1)

    step = _nice_step(hi - lo)
    ticks = list(np.arange(np.ceil(lo / step) * step, hi + 1e-6, step))
    ticks += [x for x in (start, agent_end) if x is not None and (x < lo - 300 or x > hi + 300)]
    ax.set_xticks(ticks, [_tick(x) for x in ticks], fontsize=8)
    ax.set_yticks(range(len(LANES)), [STAGE_LABELS.get(lane, lane) for lane in LANES], fontsize=8)
    ax.set_ylim(len(LANES) - 0.1, -1.2)
    ax.grid(axis="x", alpha=0.3)
    title = f"turn {turn.get('index', '?')} at {end_s:.2f} s: "
    title += "no reply" if heard is None else (
        f"heard gap {heard:.0f} ms, {gap:.0f} ms from the VAD's end (target {budgets['target']:.0f})")
    worst = max(
        (v for v in turn.get("violations") or [] if isinstance(v, dict)),
        key=lambda v: _num(v.get("over_ms")) or 0.0,
        default=None,
    )
    if worst is not None:
        title += f" — {STAGE_LABELS.get(worst.get('stage'), worst.get('stage'))} over by {worst.get('over_ms')} ms"
    ax.set_title(title, loc="left", fontsize=10, color=OVER if gap and gap > budgets["target"] else "k")
    ax.set_xlabel("ms from the end of caller speech (shaded: compressed)", fontsize=8)


def _llm_steps(ax: Axes, turn: dict[str, Any], lane: int, stages: dict[str, Any], hit: bool, rel: Any) -> None:
    """Denoising passes as ticks. Reports hold per-step durations; absolute call times also work."""
    raw = [v for x in turn.get("llm_step_times_s") or [] if (v := _num(x)) is not None]
    if not raw:
        return
    speech_start = _num(turn.get("user_speech_start_s")) or 0.0
    if all(b >= a for a, b in zip(raw, raw[1:], strict=False)) and raw[0] >= max(speech_start, 0.5):
        ends = [r for x in raw if (r := rel(x)) is not None]
    else:
        # Durations. The block was ready when the LLM stage ended, whether it was computed in
        # that stage (miss) or by a speculation still finishing (hit), so lay the steps out
        # backwards from there.
        llm_end = sum(_num(stages.get(s)) or 0.0 for s in STAGES[:3])
        ends = list(llm_end - sum(raw) * 1000.0 + np.cumsum(raw) * 1000.0)
    ax.plot(ends, [lane] * len(ends), "|", color=STAGE_COLORS["llm_block"], markersize=11, markeredgewidth=2)
    ax.text(
        ends[-1],
        lane,
        f"  {len(ends)} step{'s' if len(ends) != 1 else ''}" + (" (speculative)" if hit else ""),
        va="center",
        fontsize=8,
    )


def _over(ms: float) -> str:
    return f"+{ms:.0f}" if ms >= 1 else f"+{ms:.1f}"


def _tick(ms: float) -> str:
    if abs(ms) < 0.5:
        return "0"
    return f"{ms / 1000:+.1f} s" if abs(ms) >= 1000 else f"{ms:+.0f}"


def _axis_gap(turn: dict[str, Any]) -> float | None:
    """The gap on the panels' axis, from the VAD's end of speech (older reports: gap_ms)."""
    v = _num(turn.get("vad_gap_ms"))
    return v if v is not None else _num(turn.get("gap_ms"))


def _heard_gap(turn: dict[str, Any]) -> float | None:
    return _num(turn.get("gap_ms"))

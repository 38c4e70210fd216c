"""``voice-agent report REPORT.json [--plot timeline.png]``: where each turn's time went.

The table gives one row per turn: what the caller said, what the agent answered, the gap,
and each stage's share of it, with stages over budget in red. The plot draws the same
turns so that the stage that ate the budget is the first thing one sees:

- the top panel stacks every turn's stages as a bar, under a bar of the stage budgets and
  the target gap line, and hatches the stages over budget;
- one panel per turn then lays the turn out on its own time axis, 0 being the end of the
  caller's speech: caller speech, ASR partials, speculation starts, the endpoint decision,
  the stages as a waterfall with their budgets outlined, the LLM's denoising steps, the
  first TTS audio and the agent's playback. The axis is linear around the gap and
  compressed (shaded) before and after, so seconds of speech and a 200 ms gap fit together.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipelines.budgets import STAGES
from pipelines.report_data import ReportError, _num, _short, budgets_of, cache_note, load_report, turn_budgets

# -- table ---------------------------------------------------------------------------


SHORT = {"vad_endpoint": "EOT", "asr_final": "ASR", "llm_block": "LLM", "tts_first_audio": "TTS", "output": "out"}


def render_table(report: dict[str, Any], console: Console) -> None:
    budgets = budgets_of(report)
    call = report.get("call") or {}
    title = f"call {call.get('session_id', '?')} · {call.get('transport', '?')} · {call.get('input', '')}".rstrip(" ·")
    table = Table(title=title, show_lines=True, expand=False)
    table.add_column("#", justify="right")
    table.add_column("caller s", justify="right", no_wrap=True)
    table.add_column("caller said → agent replied", overflow="fold", min_width=24, ratio=1)
    table.add_column("gap\n≤" + f"{budgets['target']:.0f}", justify="right", no_wrap=True)
    for stage in STAGES:
        table.add_column(f"{SHORT[stage]}\n≤{budgets[stage]:.0f}", justify="right", no_wrap=True)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("spec", justify="center", no_wrap=True)
    for turn in report["turns"]:
        table.add_row(*_row(turn, turn_budgets(turn, budgets)))
    console.print(table)
    console.print(
        Text(
            "ms; EOT end of turn (speech end → endpoint), ASR final transcript, LLM first block, TTS first audio, "
            "out output buffer; red: over budget",
            style="dim",
        )
    )
    console.print(_summary_line(report, budgets))


def _row(turn: dict[str, Any], budgets: dict[str, float]) -> list[Any]:
    start, end = _num(turn.get("user_speech_start_s")), _num(turn.get("user_speech_end_s"))
    span = f"{start:.2f}–{end:.2f}" if start is not None and end is not None else "?"
    said = Text(_short(turn.get("transcript"), 120), style="bold")
    said.append("\n→ " + _short(turn.get("response") or "(no reply)", 120), style="italic")
    resumed = _num(turn.get("resumed_s"))
    if turn.get("interrupted") and resumed is not None:
        said.append(f"\n✂ barge-in with no words; went on at {resumed:.2f} s", style="yellow")
    elif turn.get("interrupted"):
        said.append(f"\n✂ barge-in; heard: {_short(turn.get('heard_response'), 60)!r}", style="yellow")
    if turn.get("first_audio") == "fallback":
        said.append("\nfallback audio first", style="yellow")
    note = cache_note(turn)
    if note:
        said.append("\n↺ " + note, style="green" if (turn.get("cache") or {}).get("state") == "hit" else "dim")
    gap = _num(turn.get("gap_ms"))
    gap_cell = Text("—" if gap is None else f"{gap:.0f}", style="" if gap is None else _style(gap, budgets["target"]))
    stages = turn.get("stages") or {}
    cells: list[Any] = []
    for stage in STAGES:
        ms = _num(stages.get(stage))
        cells.append(Text("—" if ms is None else f"{ms:.0f}", style="" if ms is None else _style(ms, budgets[stage])))
    steps = _num(stages.get("llm_steps"))
    spec = turn.get("speculation") or {}
    if spec.get("hit"):
        spec_cell = Text("hit", style="green")
    elif spec.get("used"):
        spec_cell = Text("miss", style="yellow")
    else:
        spec_cell = Text("—")
    return [
        str(turn.get("index", "?")),
        span,
        said,
        gap_cell,
        *cells,
        "—" if steps is None else f"{steps:.0f}",
        spec_cell,
    ]


def _style(ms: float, budget: float) -> str:
    return "bold red" if ms > budget else "green"


def _summary_line(report: dict[str, Any], budgets: dict[str, float]) -> Text:
    s = report.get("summary") or {}
    parts = [f"turns {s.get('turns', len(report['turns']))}", f"answered {s.get('answered', '?')}"]
    for key, label in (("gap_p50_ms", "gap p50"), ("gap_p95_ms", "p95")):
        v = _num(s.get(key))
        if v is not None:
            parts.append(f"{label} {v:.0f} ms")
    parts.append(f"target {budgets['target']:.0f} ms")
    parts.append(f"violations {s.get('violations', 0)}")
    rate = _num(s.get("speculation_hit_rate"))
    if rate is not None:
        parts.append(f"speculation hits {rate:.0%}")
    cache_rate = _num(s.get("cache_hit_rate"))
    if cache_rate is not None:
        parts.append(f"cache hits {s.get('cache_hits', 0)} ({cache_rate:.0%})")
    if s.get("interrupted"):
        parts.append(f"barge-ins {s['interrupted']}" + (f" ({s['resumed']} with no words)" if s.get("resumed") else ""))
    dtmf = report.get("dtmf") or []
    if dtmf:
        parts.append("dtmf " + "".join(str(d.get("digit", "")) for d in dtmf if isinstance(d, dict)))
    parts.extend(_call_end(report.get("call") or {}))
    return Text(" · ".join(parts))


def _call_end(call: dict[str, Any]) -> list[str]:
    """How the call ended, when the agent ended it or a transfer was asked for."""
    out = []
    transfer = call.get("transfer")
    if isinstance(transfer, dict):
        out.append(f"transfer to {transfer.get('to')} ({transfer.get('why')}): {transfer.get('result') or 'asked'}")
    if call.get("hangup"):
        out.append(f"agent hung up ({call['hangup']})")
    return out


# -- command -------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="show a call report as a per-turn table, and draw its timeline",
        description="Print a per-turn table of a call report written by `voice-agent replay --report`: what the "
        "caller said, the reply, the gap, each stage's time against its budget (over budget in red), speculation "
        "hits, barge-ins. With --plot, also draw a PNG: every turn's stages stacked against the budget, then one "
        "waterfall per turn (caller speech, partials, speculation starts, endpoint decision, LLM steps, TTS first "
        "audio, agent playback) on one time axis.",
    )
    p.add_argument("report", metavar="REPORT.json", help="call report from `voice-agent replay --report`")
    p.add_argument("--plot", metavar="timeline.png", help="also write the timeline picture here (PNG)")
    p.add_argument(
        "--turns", type=int, default=6, metavar="N", help="waterfall panels for the first N turns (default 6)"
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        report = load_report(args.report)
    except ReportError as exc:
        print(f"voice-agent: error: {exc}", file=sys.stderr)
        return 2
    # Piped output gets a fixed, readable width instead of rich's 80-column fallback.
    render_table(report, Console() if sys.stdout.isatty() else Console(width=120))
    if args.plot:
        from pipelines.report_plot import plot_timeline

        if args.turns < 0:
            print("voice-agent: error: --turns must be 0 or more", file=sys.stderr)
            return 2
        try:
            plot_timeline(report, args.plot, max_turns=args.turns)
        except OSError as exc:
            print(f"voice-agent: error: cannot write {args.plot}: {exc}", file=sys.stderr)
            return 2
        print(f"timeline written to {args.plot}")
    return 0

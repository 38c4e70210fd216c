"""`voice-agent report`: the per-turn table and the timeline PNG.

The report here is written by hand in the documented REPORT.json format, so every field the
view reads is exercised; tests/test_mqtt_e2e.py draws the report of a real replayed call.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rich.console import Console

from pipelines.report_data import STAGE_COLORS, ReportError, load_report
from pipelines.report_plot import plot_timeline
from pipelines.report_view import render_table

ROOT = Path(__file__).resolve().parents[1]


def sample_report() -> dict:
    return {
        "call": {"session_id": "demo", "transport": "replay", "input": "call.wav", "duration_s": 12.1},
        "turns": [
            {
                "index": 0,
                "user_speech_start_s": 1.02,
                "user_speech_end_s": 4.3,
                "transcript": "what time does the pharmacy open tomorrow",
                "partials": [{"t": 2.1, "text": "what time", "stable": ""}, {"t": 3.9, "text": "what time does"}],
                "response": "It opens at nine in the morning.",
                "agent_audio_start_s": 4.52,
                "agent_audio_end_s": 6.1,
                "gap_ms": 220.0,
                "interrupted": False,
                "heard_response": "It opens at nine in the morning.",
                "speculation": {"used": True, "hit": False, "started": [{"t": 4.34}], "wasted_ms": 120.0},
                "endpoint": {"t": 4.38, "silence_ms": 80, "reason": "complete"},
                "stages": {
                    "vad_endpoint": 80.0,
                    "asr_final": 30.0,
                    "llm_block": 75.0,
                    "llm_steps": 6,
                    "tts_first_audio": 25.0,
                    "output": 10.0,
                },
                "llm_step_times_s": [0.012] * 6,
                "first_audio": "content",
                "violations": [{"stage": "llm_block", "budget_ms": 40, "actual_ms": 75, "over_ms": 35}],
            },
            {
                "index": 1,
                "user_speech_start_s": 7.0,
                "user_speech_end_s": 8.5,
                "transcript": "thanks a lot",
                "response": "You are welcome, goodbye.",
                "agent_audio_start_s": 8.64,
                "agent_audio_end_s": 9.2,
                "gap_ms": 140.0,
                "interrupted": True,
                "heard_response": "You are",
                "speculation": {"used": True, "hit": True, "started": [{"t": 8.36}, {"t": 8.42}], "wasted_ms": 0.0},
                "endpoint": {"t": 8.58, "silence_ms": 80, "reason": "complete"},
                "stages": {
                    "vad_endpoint": 80.0,
                    "asr_final": 5.0,
                    "llm_block": 15.0,
                    "llm_steps": 4,
                    "tts_first_audio": 20.0,
                    "output": 10.0,
                },
                "llm_step_times_s": [0.01, 0.011, 0.01, 0.012],
                "first_audio": "content",
                "violations": [],
            },
            # the caller spoke but got no reply: most fields are missing
            {"index": 2, "user_speech_start_s": 10.0, "user_speech_end_s": 10.4, "transcript": "hmm"},
        ],
        "dtmf": [{"t": 3.0, "digit": "5"}],
        "summary": {"turns": 3, "answered": 2, "gap_p50_ms": 180.0, "gap_p95_ms": 216.0, "violations": 1},
    }


def check_png(path: Path, min_height: int = 400) -> np.ndarray:
    """A real PNG with a picture in it, not a blank canvas; returns its RGB pixels."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        rgb = np.asarray(img.convert("RGB"))
    h, w, _ = rgb.shape
    assert w >= 800 and h >= min_height, (w, h)
    inked = np.mean(np.any(rgb < 235, axis=2))
    assert 0.05 < inked < 0.9, f"{inked:.0%} of the picture is ink"
    packed = (rgb[..., 0].astype(np.int32) << 16) | (rgb[..., 1].astype(np.int32) << 8) | rgb[..., 2]
    colors = len(np.unique(packed))
    assert colors > 50, colors
    return rgb


def has_color(rgb: np.ndarray, hex_color: str, min_pixels: int = 50) -> bool:
    want = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
    return int(np.sum(np.all(np.abs(rgb.astype(int) - want) <= 6, axis=2))) >= min_pixels


def test_table_shows_every_turn_and_flags_overruns() -> None:
    console = Console(record=True, width=140, force_terminal=True, color_system="standard")
    render_table(sample_report(), console)
    plain = console.export_text(styles=False, clear=False)
    for text in ("what time does the pharmacy open tomorrow", "It opens at nine", "thanks a lot", "(no reply)"):
        assert text in plain
    assert "barge-in; heard: 'You are'" in plain
    assert "hit" in plain and "miss" in plain
    assert "gap p50 180 ms" in plain and "dtmf 5" in plain
    styled = console.export_text(styles=True)
    assert re.search(r"\x1b\[1;31m *75\x1b", styled)  # the LLM block over its 40 ms budget, in bold red
    assert re.search(r"\x1b\[1;31m *220\x1b", styled)  # the gap over the 200 ms target
    assert re.search(r"\x1b\[32m *140\x1b", styled)  # a gap within the target, in green
    report = sample_report()
    report["turns"][1]["resumed_s"] = 9.5  # a barge-in with no words: the reply went on
    report["summary"].update(interrupted=1, resumed=1)
    wide = Console(record=True, width=200)
    render_table(report, wide)
    plain = wide.export_text()
    assert "barge-in with no words; went on at 9.50 s" in plain and "(1 with no words)" in plain
    assert "hung up" not in plain and "transfer" not in plain
    report["call"].update(hangup="goodbye", transfer={"to": "sip:desk@example.com", "why": "handoff", "t": 11.0,
                                                      "result": "refused: 603 Decline"})
    render_table(report, wide)
    plain = " ".join(wide.export_text().split())  # the summary line wraps
    assert "agent hung up (goodbye)" in plain
    assert "transfer to sip:desk@example.com (handoff): refused: 603 Decline" in plain


def test_plot_is_a_png_with_every_stage_drawn(tmp_path: Path) -> None:
    out = plot_timeline(sample_report(), tmp_path / "sub" / "timeline.png")
    rgb = check_png(out, min_height=900)
    for stage, color in STAGE_COLORS.items():
        assert has_color(rgb, color), f"no {stage} bar in the picture"


def test_plot_of_an_empty_call_is_still_a_picture(tmp_path: Path) -> None:
    report = {"call": {"session_id": "quiet"}, "turns": [], "summary": {"turns": 0}}
    out = plot_timeline(report, tmp_path / "empty.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "report not found"),
        ("{not json", "is not JSON"),
        ('{"call": {}}', r"no turns\[\] list"),
        ('{"turns": [1, 2]}', "must be an object"),
    ],
)
def test_bad_report_files_are_clear_errors(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ReportError, match=message):
        load_report(path)


def test_cli_prints_the_table_and_writes_the_plot(tmp_path: Path) -> None:
    report = tmp_path / "REPORT.json"
    report.write_text(json.dumps(sample_report()))
    png = tmp_path / "timeline.png"
    cmd = [sys.executable, "-m", "pipelines.cli", "report", str(report), "--plot", str(png), "--turns", "2"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "what time does the pharmacy open tomorrow" in done.stdout
    assert f"timeline written to {png}" in done.stdout
    check_png(png)


def test_cli_error_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import main

    assert main(["report", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "report not found" in err and "Traceback" not in err

"""Every bench script still starts: its imports resolve against the code as it is now and
its command line parses (`--help`), so a change elsewhere cannot leave a benchmark broken
until someone next runs it. The measurements themselves are the scripts' own, run by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if "argparse" in p.read_text())


def test_every_runnable_bench_script_is_checked() -> None:
    # the two without a command line are modules the others import (machine.py, capacity_sip.py)
    assert len(SCRIPTS) >= 13 and {"turn_gap.py", "capacity.py", "reply_quality.py", "soak.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts(script: str) -> None:
    r = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120,
                       cwd=BENCH.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout


def test_median_runs_of_committed_results(tmp_path: Path) -> None:
    runs = [BENCH / "results" / f"turn_gap_cpu_s9_run{i}.json" for i in (1, 2, 3)]
    out = tmp_path / "m.json"
    r = subprocess.run([sys.executable, str(BENCH / "median_runs.py"), *map(str, runs), "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert r.returncode == 0, r.stderr
    m = json.loads(out.read_text())
    assert m["runs"] == 3 and m["ours"]["p50_ms"] == {"runs": [460.0, 450.0, 450.0], "median": 450.0}
    assert m["ours"]["cutoffs"]["median"] == 15
    dev = BENCH / "results" / "turn_gap_dev_agree400_cpu.json"
    r = subprocess.run([sys.executable, str(BENCH / "median_runs.py"), str(runs[0]), str(dev)],
                       capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert r.returncode == 2 and "runs differ in split" in r.stderr


def test_median_runs_of_capacity_curves_and_their_plot(tmp_path: Path) -> None:
    runs = [BENCH / "results" / f"capacity_cpu_run{i}.json" for i in (1, 2, 3)]
    curves = [json.loads(p.read_text()) for p in runs]
    out = tmp_path / "m.json"
    r = subprocess.run([sys.executable, str(BENCH / "median_runs.py"), *map(str, runs), "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert r.returncode == 0, r.stderr
    m = json.loads(out.read_text())
    for leg, got in (("replay", m), ("sip", m["sip"])):
        legs = [c if leg == "replay" else c["sip"] for c in curves]
        assert got["capacity"]["runs"] == [c["capacity"] for c in legs]
        for i, row in enumerate(got["curve"]):
            p50s = [c["curve"][i]["p50_ms"] for c in legs]
            assert row["p50_ms"] == {"runs": p50s, "median": sorted(p50s)[1]}
            assert row["calls"]["median"] == legs[0]["curve"][i]["calls"]
    assert f"replay {m['curve'][0]['calls']['median']:g} at once" in r.stdout
    svg = tmp_path / "curve.svg"
    r = subprocess.run([sys.executable, str(BENCH / "capacity.py"), "--plot-medians", str(out), "--plot", str(svg)],
                       capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert r.returncode == 0, r.stderr
    assert svg.read_text().lstrip().startswith("<?xml") and "medians of 3 runs" in svg.read_text()
    # a capacity run and a turn-gap run are not one kind of result
    r = subprocess.run([sys.executable, str(BENCH / "median_runs.py"), str(runs[0]),
                        str(BENCH / "results" / "turn_gap_cpu_peers_stream.json")],
                       capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert r.returncode == 2 and "mix turn-gap and capacity" in r.stderr

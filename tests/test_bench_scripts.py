"""Every bench script still starts: its imports resolve against the code as it is now and
its command line parses (`--help`), so a change elsewhere cannot leave a benchmark broken
until someone next runs it. The measurements themselves are the scripts' own, run by hand."""

from __future__ import annotations

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

"""A short soak (bench/soak.py): calls ending and starting, one caller vanishing mid-call, on
the real engines; nothing is left behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import speech
from tests.test_replay import RATE, build_call

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


@pytest.mark.slow
async def test_a_short_soak_leaves_no_sessions_seats_or_tasks(agent) -> None:
    from soak import soak

    lv = speech.librivox()
    calls = [(f"call{i}", build_call([clip], gap_s=1.5)[0], RATE) for i, clip in enumerate((lv[1], lv[4], lv[2]))]
    out = await soak(agent, calls, duration_s=20.0, concurrent=2, vanish_every_s=6.0, sample_every_s=5.0)
    assert not out["errors"], out["errors"]
    assert out["calls_vanished"] >= 1 and out["calls_ended"] >= 1 and out["replies"] >= 2
    assert out["leaked"]["sessions"] == 0 and out["leaked"]["seats"] == 0
    assert out["leaked"]["tasks"] <= 0, out  # every call's tasks are gone
    assert out["leaked"]["fds"] <= 2, out

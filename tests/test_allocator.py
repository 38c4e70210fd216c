"""pipelines.allocator: the glibc settings are applied once, and an operator's own win."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = "from pipelines.allocator import tune_allocator; print(tune_allocator(), tune_allocator())"


def _run(code: str, **env: str) -> str:
    """``code`` in a fresh interpreter, with no allocator settings but ``env``'s."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "VOICE_AGENT_MALLOC"}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60)
    return out.stdout.strip()


def _probe(**env: str) -> str:
    return _run(PROBE, **env)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_settings_once_per_process() -> None:
    assert _probe() == "True True"


def test_an_operators_malloc_environment_wins() -> None:
    assert _probe(MALLOC_ARENA_MAX="4") == "False False"


def test_it_can_be_turned_off() -> None:
    assert _probe(VOICE_AGENT_MALLOC="default") == "False False"


def test_release_free_memory_gives_back_what_was_freed() -> None:
    probe = ("import numpy as np\n"
             "from pipelines.allocator import release_free_memory, tune_allocator\n"
             "tune_allocator()\n"
             "blocks = [np.ones(512 * 1024 // 8) for _ in range(400)]\n"  # 200 MB of 512 kB heap blocks
             "del blocks[:-1]\n"
             "print(release_free_memory())")
    expected = "True" if platform.libc_ver()[0] == "glibc" else "False"
    assert _run(probe) == expected

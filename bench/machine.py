"""What a benchmark ran on, for its JSON: the CPU's model name and the bfloat16 units it has
(absolute times differ between the project's VMs, an Intel Xeon with AMX and an AMD EPYC
with AVX512-BF16 alone)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu() -> str:
    """E.g. ``Intel(R) Xeon(R) Processor, 2 cores, amx_bf16 avx512_bf16``."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = info.splitlines()
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())
    cores = sum(ln.startswith("processor") for ln in lines)
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    units = " ".join(f for f in ("amx_bf16", "avx512_bf16") if f in flags) or "no native bfloat16"
    return f"{name}, {cores} cores, {units}"

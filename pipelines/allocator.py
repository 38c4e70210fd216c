"""glibc malloc settings for a long-running agent process.

With glibc's defaults a 4-call soak grows about 25 MB a minute without end
(`bench/results/soak_cpu.json`): every thread that allocates gets an arena of its own (up to
8 per core), and the mmap threshold rises after the first large free, so the engines'
per-call buffers (audio windows, tensors of a few hundred kB) end up in heap arenas that
fragment and are never given back. Two arenas, a fixed 4 MB mmap threshold and a 128 kB
trim threshold are meant to keep it flat (docs/capacity.md).

`tune_allocator` applies them with ``mallopt`` at process start, before the engines' threads
exist (glibc fixes its arena limit once the eighth arena is made). It does nothing off glibc,
or when any ``MALLOC_*`` variable is set in the environment, so an operator's own settings
win; ``VOICE_AGENT_MALLOC=default`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

# glibc <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

# A fixed threshold of glibc's default 128 kB sends CTranslate2's per-call buffers to mmap:
# Whisper 1.7x slower (bench/results/allocator_speed_cpu.json); 4 MB costs it nothing measurable.
SETTINGS = {M_ARENA_MAX: 2, M_MMAP_THRESHOLD: 4 * 1024 * 1024, M_TRIM_THRESHOLD: 128 * 1024}
_applied: bool | None = None


def tune_allocator() -> bool:
    """Applies `SETTINGS` once per process; True when glibc took them (also on later calls)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("VOICE_AGENT_MALLOC", "").lower() == "default":
        return False
    if any(k.startswith("MALLOC_") for k in os.environ):
        log.debug("MALLOC_* set in the environment: allocator left as configured")
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = all(mallopt(k, v) == 1 for k, v in SETTINGS.items())
    if not _applied:
        log.warning("mallopt refused the allocator settings; memory may grow on long runs")
    return _applied

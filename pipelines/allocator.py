"""glibc malloc settings for a long-running agent process.

With glibc's defaults every thread that allocates may get an arena of its own (up to 8 per
core), and the mmap threshold rises after the first large free. Two arenas, a fixed 4 MB mmap
threshold and a 128 kB trim threshold start a 4-call soak about 200 MB lower at no measured
cost to the engines. (Its steady growth was dead calls waiting for the cyclic collector, not
the allocator: `pipelines/gc_policy.py`.)

Freed heap memory still counts as resident until glibc gives it back; `release_free_memory`
(``malloc_trim``) gives it back, and the agent calls it off the event loop when a call ends,
at most every `TRIM_EVERY_S` seconds.

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

TRIM_EVERY_S = 30.0
# A fixed mmap threshold of glibc's default 128 kB sends CTranslate2's per-call buffers to mmap:
# Whisper took 107 ms instead of 61 (bench/allocator_speed.py, 3 rounds); at 4 MB the engines
# run as fast as with the defaults (bench/results/allocator_speed_cpu.json).
SETTINGS = {M_ARENA_MAX: 2, M_MMAP_THRESHOLD: 4 * 1024 * 1024, M_TRIM_THRESHOLD: 128 * 1024}
_applied: bool | None = None
_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            return None  # not glibc (musl, macOS)
        _libc = lib
    return _libc


def release_free_memory() -> bool:
    """Blocking (a few ms): gives the heap's free pages back to the OS. True if any were."""
    lib = _glibc()
    return bool(lib.malloc_trim(0)) if lib is not None else False


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
    lib = _glibc()
    if lib is None:
        return False
    _applied = all(lib.mallopt(k, v) == 1 for k, v in SETTINGS.items())
    if not _applied:
        log.warning("mallopt refused the allocator settings; memory may grow on long runs")
    return _applied

"""Python's cyclic garbage collector in a long-running agent process.

A call's objects refer to each other (the session, its turn records, the callbacks its
opinions and tasks hold, its transport), so when a call ends its memory is freed by the cyclic
collector, not by reference counts: the ASR's audio buffer, the resamplers, the output track.
CPython runs a full collection only when the objects that survived two collections have grown
by a quarter since the last one, and once the engines are loaded the process holds about
495,000 tracked objects (torch, transformers, tokenizers). So on a busy agent the dead calls
piled up between rare full collections (resident memory grew about 25 MB a minute in a 4-call
soak), and each full collection walked every object of the engines: 335 ms measured here,
with the event loop, and every call's audio, stopped meanwhile.

`freeze_loaded` moves what is alive once the engines are loaded into the permanent generation
(``gc.freeze``): the collector no longer walks it, a full collection takes about 1 ms, and the
automatic ones come as often as the calls' own objects warrant. `collect_ended_call` runs one
when a call ends: what the calls that ended before it left is freed then (the one closing is
still referenced while it closes), and the automatic collections free the rest.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

SLOW_COLLECT_MS = 20.0  # a collection this long on the event loop is worth a warning


def freeze_loaded() -> int:
    """Blocking, once the engines are loaded: collects what loading left behind, then freezes
    everything alive. Returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def collect_ended_call() -> float:
    """A call has ended: one full collection frees the objects of the calls already closed
    (about 1 ms after `freeze_loaded`). Returns the milliseconds it took."""
    t0 = time.perf_counter()
    gc.collect()
    ms = (time.perf_counter() - t0) * 1000
    if ms > SLOW_COLLECT_MS:
        log.warning("a full garbage collection took %.0f ms (were the engines frozen? pipelines/gc_policy.py)", ms)
    return ms

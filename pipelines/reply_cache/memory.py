"""The in-process store: least recently used entries go first, bounded by count and bytes,
and each entry expires ``ttl_s`` after it was written. Used from the event loop only."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from pipelines.reply_cache.entry import CachedReply


class MemoryStore:
    backend = "memory"
    available = True
    last_error = ""

    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[CachedReply, float]] = OrderedDict()  # key -> (entry, expires)
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> CachedReply | None:
        item = self._entries.get(key)
        if item is None:
            return None
        entry, expires = item
        if self._clock() >= expires:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    async def put(self, key: str, entry: CachedReply) -> bool:
        size = entry.nbytes
        if size > self.max_bytes:
            return False
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (entry, self._clock() + self.ttl_s)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        return True

    def _drop(self, key: str) -> None:
        entry, _ = self._entries.pop(key)
        self.bytes -= entry.nbytes

    async def aclose(self) -> None:
        return None

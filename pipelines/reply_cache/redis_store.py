"""The shared store: one Redis that every worker of an agent fleet reads and writes.

Entries travel FLAC-compressed (`entry.encode`) under ``{namespace}:v{version}:reply:{hash}``
with Redis's own expiry (``PX`` = ``cache.ttl_s``). The key scheme is bounded: a sorted set
``{namespace}:v{version}:index`` scores each key by its last use, and a write that takes the
index past ``cache.max_entries`` unlinks the least recently used keys, in the same Lua script
(one round trip, atomic). Bytes are bounded per entry (``cache.max_bytes``) and, for the
whole server, by Redis's ``maxmemory`` with ``allkeys-lru`` (see docs/cache.md).

Redis may go away at any time. Every operation is bounded (``redis.op_timeout_ms``) and
never raises: on a failure the store marks itself down, answers None at once, and a
background task pings with a doubling backoff (``reconnect_min_s`` .. ``reconnect_max_s``)
until Redis answers again. Nothing here blocks the event loop: the client is
``redis.asyncio`` and FLAC coding runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from pipelines.reply_cache.config import RedisCacheConfig
from pipelines.reply_cache.entry import CachedReply, EntryFormatError, decode, encode

log = logging.getLogger(__name__)

# KEYS: entry, index. ARGV: blob, ttl ms, now, max entries, oldest score kept
_PUT = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[3], KEYS[1])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do redis.call('UNLINK', old[i]) end
  return over
end
return 0
"""
# KEYS: entry, index. ARGV: now
_GET = """
local v = redis.call('GET', KEYS[1])
if v then redis.call('ZADD', KEYS[2], 'XX', ARGV[1], KEYS[1]) else redis.call('ZREM', KEYS[2], KEYS[1]) end
return v
"""
_FAILURES = (RedisError, OSError, asyncio.TimeoutError)


class RedisStore:
    backend = "redis"

    def __init__(self, cfg: RedisCacheConfig, index_key: str, max_entries: int, max_bytes: int, ttl_s: float,
                 on_state: Callable[[bool, str], None] | None = None) -> None:
        self.cfg = cfg
        self.index_key = index_key
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.on_state = on_state
        self.available = True  # until an operation fails
        self.last_error = ""
        self.evictions = 0
        self._client: aioredis.Redis | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._put_script: object = None
        self._get_script: object = None
        self._reconnect: asyncio.Task[None] | None = None
        self._timeout_s = (cfg.op_timeout_ms + cfg.connect_timeout_ms) / 1000.0

    def _redis(self) -> aioredis.Redis:
        """The client of the running loop (a redis.asyncio client belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = aioredis.Redis.from_url(
                self.cfg.url, socket_timeout=self.cfg.op_timeout_ms / 1000.0,
                socket_connect_timeout=self.cfg.connect_timeout_ms / 1000.0,
                retry=Retry(NoBackoff(), 0), health_check_interval=0)
            self._loop = loop
            self._put_script = self._client.register_script(_PUT)
            self._get_script = self._client.register_script(_GET)
        return self._client

    async def get(self, key: str) -> CachedReply | None:
        if not self.available:
            return None
        try:
            self._redis()
            blob = await asyncio.wait_for(
                self._get_script(keys=[key, self.index_key], args=[time.time()]),  # type: ignore[operator]
                self._timeout_s)
        except _FAILURES as exc:
            self._down(exc)
            return None
        if blob is None:
            return None
        try:
            return await asyncio.to_thread(decode, bytes(blob))
        except EntryFormatError as exc:
            log.warning("reply cache: %s under %s", exc, key)
            return None

    async def put(self, key: str, entry: CachedReply) -> bool:
        if not self.available:
            return False
        blob = await asyncio.to_thread(encode, entry)
        if len(blob) > self.max_bytes:
            return False
        now = time.time()
        try:
            self._redis()
            over = await asyncio.wait_for(
                self._put_script(keys=[key, self.index_key],  # type: ignore[operator]
                                 args=[blob, int(self.ttl_s * 1000), now, self.max_entries, now - self.ttl_s]),
                self._timeout_s)
        except _FAILURES as exc:
            self._down(exc)
            return False
        self.evictions += int(over or 0)
        return True

    def _down(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        if self.available:
            self.available = False
            log.warning("reply cache: Redis at %s is down (%s); calls go on uncached", self.cfg.url, self.last_error)
            if self.on_state is not None:
                self.on_state(False, self.last_error)
        if self._reconnect is None or self._reconnect.done():
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        delay = self.cfg.reconnect_min_s
        while True:
            await asyncio.sleep(delay)
            client = self._redis()
            try:
                await client.connection_pool.disconnect()  # connections to the old server are dead
                await asyncio.wait_for(client.ping(), self._timeout_s)
            except _FAILURES as exc:
                self.last_error = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
                delay = min(delay * 2, self.cfg.reconnect_max_s)
                continue
            self.available = True
            self.last_error = ""
            log.info("reply cache: Redis at %s is back", self.cfg.url)
            if self.on_state is not None:
                self.on_state(True, "")
            return

    async def aclose(self) -> None:
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
        if self._client is not None and self._loop is asyncio.get_running_loop():
            with contextlib.suppress(*_FAILURES):
                await self._client.aclose()
        self._client = None

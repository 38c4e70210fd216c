"""The reply cache's parts without the models: which turns may be cached, keys, the FLAC
entry format on real speech, the memory LRU (entries, bytes, TTL), and the Redis backend
against a real redis-server on loopback (bounded keys, TTL, down and back)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from llm.config import LlmConfig
from pipelines.config import ConfigError, parse_config
from pipelines.reply_cache.cache import ReplyCache
from pipelines.reply_cache.config import CacheConfig, RedisCacheConfig
from pipelines.reply_cache.entry import CachedReply, decode, encode
from pipelines.reply_cache.key import ReplyContext, ReplyKeys
from pipelines.reply_cache.memory import MemoryStore
from pipelines.reply_cache.redis_store import RedisStore
from pipelines.reply_cache.specifics import specifics
from tests import speech
from tests.redis_server import RedisServer, running_redis
from voice.audio import read_wav
from voice.tts_config import TtsConfig


def _context(**llm: object) -> ReplyContext:
    return ReplyContext.build("model-a", "persona-a", LlmConfig(**llm), TtsConfig(), None, None, 22050)


def _speech_reply(i: int = 1, text: str = "He was not an ill disposed young man.") -> CachedReply:
    """A reply whose audio is a real recorded clip cut in two clauses."""
    pcm, rate = read_wav(speech.librivox()[i].path, 22050)
    half = len(pcm) // 2
    return CachedReply(text, ("He was not", "an ill disposed young man."), (pcm[:half].copy(), pcm[half:].copy()), rate)


@pytest.mark.parametrize(("text", "reason"), [
    ("He was not an ill-disposed young man.", None),
    ("Can you hear me? I think so.", None),
    ("I'm calling about my order, OK?", None),
    ("My code is 4 2 7.", "digits"),
    ("Ten of clubs.", "number word"),
    ("I need twenty-five of them.", "number word"),
    ("And Mr. John Dashwood had then leisure.", "name"),
    ("And so my fellow Americans, ask not.", "name"),
    ("It's spelled J-O-H-N.", "spelled"),
    ("That's j o h n.", "spelled"),
    ("J. O. H. N.", "spelled"),
])
def test_specifics(text: str, reason: str | None) -> None:
    assert specifics(text) == reason


def test_key_is_words_and_everything_that_shapes_the_reply() -> None:
    keys = ReplyKeys("ns", 1, _context())
    k = keys.key("Can you hear me?", [])
    assert k is not None and k.startswith("ns:v1:reply:")
    assert keys.key("can you hear me", []) == k  # case and punctuation are not words
    assert keys.key("can you hear me now", []) != k
    assert keys.key("can you hear me", [("hello", "Hi there!")]) != k  # history the prompt holds
    assert ReplyKeys("ns", 2, _context()).key("can you hear me", []) != k  # version
    assert ReplyKeys("other", 1, _context()).key("can you hear me", []) != k  # namespace
    assert ReplyKeys("ns", 1, _context(tau=0.5)).key("can you hear me", []) != k  # decoding
    assert ReplyKeys("ns", 1, _context(threads=2)).key("can you hear me", []) == k  # not decoding
    other_model = ReplyContext.build("model-b", "persona-a", LlmConfig(), TtsConfig(), None, None, 22050)
    other_persona = ReplyContext.build("model-a", "persona-b", LlmConfig(), TtsConfig(), None, None, 22050)
    other_voice = ReplyContext.build("model-a", "persona-a", LlmConfig(), TtsConfig(length_scale=1.2), None, None,
                                     22050)
    for ctx in (other_model, other_persona, other_voice):
        assert ReplyKeys("ns", 1, ctx).key("can you hear me", []) != k
    assert keys.key(" . ", []) is None


def test_model_fingerprint_is_the_content() -> None:
    from pathlib import Path

    from llm.fingerprint import model_fingerprint

    root = Path(__file__).resolve().parents[1] / "llm" / "weights"
    assert model_fingerprint(root / "bdlm") == model_fingerprint(root / "bdlm")
    assert model_fingerprint(root / "bdlm") != model_fingerprint(root / "ar")


def test_flac_entry_round_trip_is_lossless_and_smaller() -> None:
    entry = _speech_reply()
    blob = encode(entry)
    back = decode(blob)
    assert back.text == entry.text and back.clauses == entry.clauses and back.sample_rate == 22050
    for a, b in zip(entry.audio, back.audio, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(blob) < 0.8 * sum(a.nbytes for a in entry.audio)


async def test_memory_lru_by_entries_bytes_and_ttl() -> None:
    e = _speech_reply()
    store = MemoryStore(max_entries=2, max_bytes=10 * e.nbytes, ttl_s=3600)
    for k in ("a", "b"):
        assert await store.put(k, e)
    assert await store.get("a") is e  # "a" is now the most recently used
    assert await store.put("c", e)
    assert await store.get("b") is None and await store.get("a") is e and len(store) == 2
    assert store.evictions == 1

    by_bytes = MemoryStore(max_entries=100, max_bytes=int(2.5 * e.nbytes), ttl_s=3600)
    for k in ("a", "b", "c"):
        assert await by_bytes.put(k, e)
    assert [await by_bytes.get(k) is not None for k in ("a", "b", "c")] == [False, True, True]
    assert by_bytes.bytes == 2 * e.nbytes
    assert not await MemoryStore(100, e.nbytes - 1, 3600).put("big", e)  # larger than the whole bound

    short = MemoryStore(max_entries=10, max_bytes=10 * e.nbytes, ttl_s=0.2)
    assert await short.put("a", e)
    assert await short.get("a") is e
    await asyncio.sleep(0.25)
    assert await short.get("a") is None and short.bytes == 0


async def test_cache_refuses_what_must_not_be_replayed() -> None:
    cache = ReplyCache(CacheConfig(), _context())
    e = _speech_reply()
    args = (e.text, list(e.clauses), list(e.audio), e.sample_rate)
    look = await cache.lookup("He was not an ill disposed young man.", [])
    assert look.state == "miss"
    assert await cache.store(look, *args, deadline_missed=True, fallback=False) == "deadline missed"
    assert await cache.store(look, *args, deadline_missed=False, fallback=True) == "fallback"
    assert await cache.store(look, e.text, list(e.clauses), [e.audio[0]], 22050, deadline_missed=False,
                             fallback=False) == "incomplete"
    assert (await cache.lookup("he was not an ill disposed young man", [])).state == "miss"
    assert await cache.store(look, *args, deadline_missed=False, fallback=False) == "stored"
    hit = await cache.lookup("He was not an ill-disposed young man!", [])
    assert hit.state == "hit" and hit.entry is not None and hit.entry.text == e.text
    spec = await cache.lookup("Ten of clubs.", [])
    assert spec.state == "uncacheable" and spec.reason == "number word"
    assert await cache.store(spec, *args, deadline_missed=False, fallback=False) == "number word"
    allowed = ReplyCache(CacheConfig(allow_specifics=True), _context())
    assert (await allowed.lookup("Ten of clubs.", [])).state == "miss"


def test_cache_config_is_validated_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"cache\.backend"):
        parse_config({"cache": {"backend": "memcached"}})
    with pytest.raises(ConfigError, match=r"cache\.redis\.url"):
        parse_config({"cache": {"redis": {"url": "http://x"}}})
    with pytest.raises(ConfigError, match=r"cache\.redis: .*reconnect_min_s"):
        parse_config({"cache": {"redis": {"reconnect_min_s": 10, "reconnect_max_s": 1}}})
    assert parse_config({"cache": {"backend": "redis"}}).cache.backend == "redis"


def _redis_store(server: RedisServer, **kw: object) -> RedisStore:
    cfg = RedisCacheConfig(url=server.url, reconnect_min_s=0.05, reconnect_max_s=0.4)
    args: dict = {"index_key": "t:v1:index", "max_entries": 100, "max_bytes": 2**24, "ttl_s": 3600.0} | kw
    return RedisStore(cfg, **args)


@pytest.mark.peer
async def test_redis_store_bounded_keys_and_ttl() -> None:
    e = _speech_reply()
    with running_redis() as server:
        store = _redis_store(server, max_entries=2)
        for k in ("t:v1:reply:a", "t:v1:reply:b"):
            assert await store.put(k, e)
        got = await store.get("t:v1:reply:a")  # "a" is now the most recently used
        assert got is not None and got.text == e.text
        np.testing.assert_array_equal(got.audio[1], e.audio[1])
        assert await store.put("t:v1:reply:c", e)
        assert await store.get("t:v1:reply:b") is None
        assert await store.get("t:v1:reply:a") is not None and await store.get("t:v1:reply:c") is not None
        assert store.evictions == 1
        client = store._redis()
        assert await client.zcard("t:v1:index") == 2
        assert await client.exists("t:v1:reply:b") == 0
        # stored compressed, with Redis's own expiry
        assert 0 < await client.strlen("t:v1:reply:a") < 0.8 * sum(a.nbytes for a in e.audio)
        assert 3_590_000 < await client.pttl("t:v1:reply:a") <= 3_600_000

        short = _redis_store(server, index_key="u:v1:index", ttl_s=0.2)
        assert await short.put("u:v1:reply:a", e)
        assert await short.get("u:v1:reply:a") is not None
        await asyncio.sleep(0.3)
        assert await short.get("u:v1:reply:a") is None
        assert not await _redis_store(server, max_bytes=1000).put("t:v1:reply:big", e)  # over the entry bound
        await store.aclose()
        await short.aclose()


@pytest.mark.peer
async def test_redis_store_down_and_back_without_blocking() -> None:
    e = _speech_reply()
    states: list[bool] = []
    with running_redis() as server:
        store = _redis_store(server, on_state=lambda up, err: states.append(up))
        assert await store.put("t:v1:reply:a", e)
        server.kill()
        t0 = time.perf_counter()
        assert await store.get("t:v1:reply:a") is None
        assert time.perf_counter() - t0 < 0.3  # bounded by op + connect timeouts, not hung
        assert not store.available and states == [False] and store.last_error
        t0 = time.perf_counter()
        assert await store.get("t:v1:reply:a") is None and not await store.put("t:v1:reply:a", e)
        assert time.perf_counter() - t0 < 0.05  # while down: no network at all
        # the event loop keeps running while the store waits to reconnect
        ticks = 0
        for _ in range(10):
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 10
        server.start()  # same port, empty memory
        deadline = time.monotonic() + 5
        while not store.available and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert store.available and states == [False, True]
        assert await store.get("t:v1:reply:a") is None  # a restarted Redis has lost its entries
        assert await store.put("t:v1:reply:a", e) and await store.get("t:v1:reply:a") is not None
        await store.aclose()


def test_prometheus_counts_cache_hits_and_misses() -> None:
    from pipelines.events import EventBus, SessionStart, TurnCompleted
    from pipelines.metrics import AgentMetrics

    bus = EventBus()
    m = AgentMetrics().attach(bus)
    bus.emit(SessionStart("s", 0.0, transport="sip"))
    for state in ("hit", "hit", "miss", "unavailable", "uncacheable", "off"):
        bus.emit(TurnCompleted("s", 1.0, report={"cache": {"state": state}}))
    value = m.registry.get_sample_value
    assert value("voice_agent_reply_cache_hits_total", {"transport": "sip"}) == 2
    assert value("voice_agent_reply_cache_misses_total", {"transport": "sip"}) == 2

"""`ReplyCache`: a turn's reply, looked up by what the caller said, or stored once spoken.

The session asks `lookup` with the final transcript (or a speculation's hypothesis) and the
history; a hit holds the reply's text and every clause's audio, so the turn needs no LM and
no TTS. After a miss the session hands the reply back with `store` once every clause has
been synthesised; `store` refuses what must not be replayed:

- a turn with specifics (`specifics.specifics`) unless ``cache.allow_specifics``;
- a reply cut short by the LM's deadline (anytime decoding ended it early);
- a turn whose answer began with the fallback acknowledgement;
- a reply not synthesised to its end (barge-in, take-back).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm.fingerprint import model_fingerprint
from llm.persona import persona_fingerprint
from llm.remote import RemoteResponder
from llm.responder import Responder
from pipelines.reply_cache.config import CacheConfig
from pipelines.reply_cache.entry import CachedReply
from pipelines.reply_cache.key import ReplyContext, ReplyKeys
from pipelines.reply_cache.memory import MemoryStore
from pipelines.reply_cache.redis_store import RedisStore
from pipelines.reply_cache.specifics import specifics
from voice.tts import PiperTTS


@dataclass
class Lookup:
    state: str  # hit | miss | unavailable (backend down) | uncacheable | off
    key: str | None = None
    entry: CachedReply | None = None
    reason: str = ""  # why uncacheable
    ms: float = 0.0

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "lookup_ms": round(self.ms, 2), "stored": False}
        if self.reason:
            out["reason"] = self.reason
        return out


class ReplyCache:
    def __init__(self, cfg: CacheConfig, context: ReplyContext,
                 visible_history: Callable[[list[tuple[str, str]]], list[tuple[str, str]]] = lambda h: [],
                 on_state: Callable[[bool, str], None] | None = None) -> None:
        self.cfg = cfg
        self.keys = ReplyKeys(cfg.namespace, cfg.version, context)
        self.visible_history = visible_history
        self.on_state = on_state
        self.transitions = 0  # the backend went down or came back this many times
        if cfg.backend == "redis":
            self.backend_store: MemoryStore | RedisStore = RedisStore(
                cfg.redis, f"{self.keys.prefix}:index", cfg.max_entries, cfg.max_bytes, cfg.ttl_s, self._state)
        else:
            self.backend_store = MemoryStore(cfg.max_entries, cfg.max_bytes, cfg.ttl_s)

    @classmethod
    def for_engines(cls, cfg: CacheConfig, responder: Responder | RemoteResponder, tts: PiperTTS) -> ReplyCache:
        """Blocking: hashes the reply model's files (memoised; about 20 ms for the embedded one).
        A remote model is known by its server, its name and the system prompt sent with it."""
        if isinstance(responder, Responder):
            model = model_fingerprint(responder.lm.path)
        else:
            o = responder.cfg.openai
            prompt = hashlib.sha256(o.system_prompt.encode()).hexdigest()[:16]
            model = f"openai:{o.base_url}:{o.model}:{prompt}"
        context = ReplyContext.build(
            model, persona_fingerprint(), responder.cfg, tts.cfg,
            getattr(tts, "config_file", None), getattr(tts, "model_file", None), tts.sample_rate)
        return cls(cfg, context, responder.visible_history)

    @property
    def backend(self) -> str:
        return self.backend_store.backend

    @property
    def available(self) -> bool:
        return self.backend_store.available

    @property
    def last_error(self) -> str:
        return self.backend_store.last_error

    def _state(self, up: bool, error: str) -> None:
        self.transitions += 1
        if self.on_state is not None:
            self.on_state(up, error)

    def turn_key(self, transcript: str, history: list[tuple[str, str]]) -> Lookup | None:
        """The key of a turn, or why it has none (None: no words at all)."""
        key = self.keys.key(transcript, self.visible_history(history))
        if key is None:
            return None
        reason = None if self.cfg.allow_specifics else specifics(transcript)
        return Lookup("uncacheable", key, reason=reason) if reason else Lookup("miss", key)

    async def lookup(self, transcript: str, history: list[tuple[str, str]]) -> Lookup:
        t0 = time.perf_counter()
        found = self.turn_key(transcript, history)
        if found is None:
            return Lookup("uncacheable", reason="no words")
        if found.state == "uncacheable" or found.key is None:
            return found
        if not self.backend_store.available:
            found.state = "unavailable"
            return found
        entry = await self.backend_store.get(found.key)
        found.ms = (time.perf_counter() - t0) * 1000
        if entry is not None:
            found.state, found.entry = "hit", entry
        elif not self.backend_store.available:
            found.state = "unavailable"
        return found

    async def store(self, lookup: Lookup, text: str, clauses: list[str], audio: list[np.ndarray], sample_rate: int,
                    *, deadline_missed: bool, fallback: bool) -> str:
        """Store a reply fresh from the LM and TTS. Returns "stored" or why not."""
        if lookup.key is None or lookup.state not in ("miss", "unavailable"):
            return lookup.reason or lookup.state
        if deadline_missed:
            return "deadline missed"
        if fallback:
            return "fallback"
        if not clauses or len(audio) != len(clauses) or any(len(a) == 0 for a in audio):
            return "incomplete"
        entry = CachedReply(text, tuple(clauses), tuple(audio), sample_rate)
        if not await self.backend_store.put(lookup.key, entry):
            return "unavailable" if not self.backend_store.available else "too large"
        return "stored"

    async def aclose(self) -> None:
        await self.backend_store.aclose()

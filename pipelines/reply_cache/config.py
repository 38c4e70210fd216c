"""Settings of the reply cache; the agent's ``cache:`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from voice.settings import Section


class RedisCacheConfig(Section):
    url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^rediss?://", description="the shared Redis")
    op_timeout_ms: int = Field(50, ge=1, le=10000, description="one GET/SET; past it Redis counts as down")
    connect_timeout_ms: int = Field(200, ge=1, le=10000)
    reconnect_min_s: float = Field(0.2, gt=0, le=60, description="first wait before pinging a Redis that went down")
    reconnect_max_s: float = Field(5.0, gt=0, le=600, description="the backoff doubles up to this")

    @model_validator(mode="after")
    def _backoff(self) -> RedisCacheConfig:
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError("reconnect_min_s must not exceed reconnect_max_s")
        return self


class CacheConfig(Section):
    enabled: bool = Field(True, description="answer a turn said before from the cache: no LM, no TTS")
    backend: Literal["memory", "redis"] = Field("memory", description="memory: this process; redis: every worker")
    namespace: str = Field("voice-agent", pattern=r"^[A-Za-z0-9_.-]+$", description="key prefix")
    version: int = Field(1, ge=0, description="bump to drop every entry written before")
    ttl_s: float = Field(86400.0, gt=0, le=365 * 86400.0, description="an entry lives this long after it is written")
    max_entries: int = Field(1000, ge=1, le=10_000_000, description="least recently used entries go past this")
    max_bytes: int = Field(64 * 2**20, ge=1024, le=2**40,
                           description="memory backend: entries' audio and text; redis: the largest entry kept")
    allow_specifics: bool = Field(
        False, description="also cache turns with digits, number words, names or spelled letters")
    redis: RedisCacheConfig = Field(default_factory=RedisCacheConfig)

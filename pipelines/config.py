"""Configuration: every knob of the agent, validated at load.

An unknown key or a bad value is rejected, and the error names the key path
(for example ``budgets.llm_block_ms``).

The engines' own sections live beside them and are composed here: ``asr`` is
`voice.asr_config.AsrConfig`, ``tts`` `voice.tts_config.TtsConfig`, ``sip``
`voice.transports.sip.config.SipConfig`, ``llm`` `llm.config.LlmConfig` and ``cache``
`pipelines.reply_cache.config.CacheConfig`, ``agent`` (capacity and overload)
`pipelines.admission.CapacityConfig`; their names stay importable from this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from llm.config import LlmConfig
from pipelines.admission import CapacityConfig
from pipelines.reply_cache.config import CacheConfig
from voice.asr_config import AsrConfig
from voice.settings import Section
from voice.transports.sip.config import SipConfig
from voice.tts_config import TtsConfig


class ConfigError(ValueError):
    """Invalid configuration; the message names the offending key."""


class AudioConfig(Section):
    asr_rate: Literal[16000] = 16000  # Whisper's rate
    frame_ms: Literal[10, 20, 30] = 20


class VadConfig(Section):
    aggressiveness: int = Field(2, ge=0, le=3)
    frame_ms: Literal[10, 20, 30] = 20
    start_ms: int = Field(60, ge=10, le=1000, description="voiced run that starts speech")
    stop_ms: int = Field(80, ge=20, le=3000, description="unvoiced run that marks a pause")
    level_gate_db: float = Field(
        40.0, ge=0, le=90, description="a frame this far below the caller's loudest of the last 10 s (or within "
                                       "10 dB of the line's noise floor) is unvoiced; 0 turns the gate off")
    noise_margin_share: float | None = Field(
        None, gt=0, le=1, description="for noisy lines: the margin over the noise floor is this share of the "
                                      "line's range (loudest frame over floor), at most 10 dB, instead of 10 dB; "
                                      "0.2 kept a caller's soft last syllables speech at 15 dB SNR")


# where a call can be transferred: a SIP, SIPS or tel URI (`turn.transfer_to`, MQTT `transfer`)
TRANSFER_URI = r"(sips?|tel):\S+"


class TurnConfig(Section):
    min_silence_ms: int = Field(80, ge=0, le=3000, description="silence before a complete-looking turn commits")
    incomplete_silence_ms: int = Field(900, ge=0, le=5000, description="silence after a trailing function word")
    agree_silence_ms: int = Field(
        380, ge=0, le=5000, description="with Smart Turn: silence when the words and the pause's sound both say done")
    disagree_silence_ms: int = Field(
        800, ge=0, le=5000, description="with Smart Turn: silence when the words and the pause's sound disagree")
    max_silence_ms: int = Field(1200, ge=0, le=10000, description="commit regardless after this much silence")
    adapt_to_caller: bool = True
    lm_end_of_turn: bool = Field(
        True, description="ask the LM how likely the hypothesis is a whole turn (needs the model's turn_end.json)")
    smart_turn: bool = Field(
        True, description="weigh Smart Turn v3.2's reading of the pause's sound beside the words "
                          "(needs the model from scripts/fetch_models.py)")
    smart_turn_model: str | None = Field(None, description="path to smart-turn-v3.2-cpu.onnx; default: the fetched one")
    speculation: bool = True
    max_speculations: int = Field(2, ge=0, le=8)
    redenoise: bool = Field(
        True, description="a new hypothesis re-decodes only the changed and unsure positions of the previous "
                          "speculation's block (warm start) instead of starting from all masks")
    barge_in: bool = True
    takeback_ms: int = Field(
        600, ge=0, le=5000, description="a caller who speaks again this soon after the reply became audible goes on "
                                        "with their turn: the reply stops at once and the turn is answered whole")
    takeback_on_voiced: bool = Field(
        True, description="take a reply back at the caller's first voiced frame in the take-back window, "
                          "not at the VAD's speech start")
    barge_in_min_ms: int = Field(300, ge=0, le=3000, description="caller speech shorter than this is a backchannel")
    resume_false_interruption: bool = Field(
        True, description="a barge-in whose sound had no words (a cough, a door, line noise) was not the caller "
                          "taking the turn: the agent says again the sentence it was cut off in, and the rest")
    fallback: bool = False
    fallback_text: str = "Mm-hmm."
    greeting: str | None = Field(
        None, min_length=1, description="said as the call starts, before the caller speaks; the caller can talk "
                                        "over it (null: the agent waits for the caller to speak first)")
    idle_prompt_s: float | None = Field(
        None, gt=0.0, le=600.0, description="the caller silent this long after the agent last spoke: "
                                            "turn.idle_prompt_text is said (null: never)")
    idle_prompt_text: str = Field("Are you still there?", min_length=1)
    idle_hangup_after: int = Field(
        2, ge=0, le=100, description="prompts a silent caller gets before the agent says turn.idle_goodbye_text "
                                     "and hangs up (0: it never hangs up)")
    idle_goodbye_text: str = Field("I'll end the call now. Goodbye.", min_length=1)
    end_call_on_goodbye: bool = Field(
        False, description="the caller said goodbye and the agent's reply, heard whole, was a goodbye too: the "
                           "agent hangs up end_call_grace_ms after it (caller speech in between keeps the call)")
    end_call_grace_ms: int = Field(1000, ge=0, le=30000, description="how long after its goodbye the agent hangs up")
    transfer_to: str | None = Field(
        None, pattern=f"^{TRANSFER_URI}$", description="where a reply that hands the caller over (\"I'm handing "
        "you over to a colleague now.\") transfers the call once heard, e.g. sip:desk@10.0.0.5 (SIP REFER; null: "
        "the call goes on)")


class BudgetConfig(Section):
    target_gap_ms: int = Field(200, ge=10, le=10000)
    endpoint_ms: int = Field(80, ge=0, le=5000, description="deciding the endpoint, beyond the silence it requires")
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


class OutputConfig(Section):
    buffer_ms: int = Field(20, ge=0, le=1000, description="playout buffer before the caller hears audio")


class MqttConfig(Section):
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


class WebrtcConfig(Section):
    host: str = Field("127.0.0.1", description="bind address; a loopback address keeps media on loopback too")
    port: int = Field(8080, ge=1, le=65535)
    token: str | None = Field(None, description="signalling token; None: a random one, printed at start")
    max_sessions: int | None = Field(
        None, ge=1, le=1000, description="this endpoint's own cap below agent.max_calls; None: agent.max_calls only")
    idle_timeout_s: float = Field(5.0, ge=1.0, le=120.0, description="no caller audio this long: the peer is gone")


class LivekitConfig(Section):
    url: str | None = Field(None, description="ws(s):// server URL; else $LIVEKIT_URL")
    api_key: str | None = Field(None, description="else $LIVEKIT_API_KEY")
    api_secret: str | None = Field(None, description="else $LIVEKIT_API_SECRET")
    participant: str | None = Field(None, description="only talk to this identity; None: the first caller")
    rejoin_grace_s: float = Field(10.0, ge=0.0, le=600.0, description="a caller who left may reconnect this long")


class MetricsConfig(Section):
    prometheus_port: int | None = Field(None, ge=0, le=65535, description="serve /metrics here; None: off, 0: any")
    prometheus_host: str = "127.0.0.1"


class AgentConfig(Section):
    agent: CapacityConfig = Field(default_factory=CapacityConfig)
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
    cache: CacheConfig = Field(default_factory=CacheConfig)


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

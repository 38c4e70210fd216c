"""Our engines as livekit-agents plugins, and a room-less AgentSession replay harness.

from livekit.agents import AgentSession
from pipelines.livekit_plugins import livekit_plugins_for

stt, llm, tts = livekit_plugins_for(agent)      # agent = await pipelines.agent.Agent.load()
session = AgentSession(stt=stt, llm=llm, tts=tts)
"""

from pipelines.livekit_plugins.llm_diffusion import DiffusionLLM
from pipelines.livekit_plugins.session_replay import (
    PacedAudioOutput,
    ReplayAudioInput,
    livekit_plugins_for,
    run_livekit_session,
)
from pipelines.livekit_plugins.stt_whisper import WhisperSTT
from pipelines.livekit_plugins.tts_piper import PiperStreamingTTS

__all__ = [
    "DiffusionLLM",
    "PacedAudioOutput",
    "PiperStreamingTTS",
    "ReplayAudioInput",
    "WhisperSTT",
    "livekit_plugins_for",
    "run_livekit_session",
]

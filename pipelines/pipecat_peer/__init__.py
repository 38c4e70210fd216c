"""Our engines in a Pipecat 1.14 pipeline, and a replay harness for it: the Pipecat peer of
`pipelines.livekit_plugins` in the turn-gap benchmark (docs/pipecat.md).

from pipelines.pipecat_peer import run_pipecat_session

res = await run_pipecat_session(agent, pcm16k)  # agent = await pipelines.agent.Agent.load()
"""

from pipelines.pipecat_peer.llm_diffusion import DiffusionLLMService
from pipelines.pipecat_peer.session_replay import build_pipeline, run_pipecat_session
from pipelines.pipecat_peer.stt_whisper import WhisperSegmentedSTT
from pipelines.pipecat_peer.transports import PacedOutputTransport, ReplayInputTransport
from pipelines.pipecat_peer.tts_piper import PiperTTSService

__all__ = [
    "DiffusionLLMService",
    "PacedOutputTransport",
    "PiperTTSService",
    "ReplayInputTransport",
    "WhisperSegmentedSTT",
    "build_pipeline",
    "run_pipecat_session",
]

"""Replay a recorded call through a real Pipecat 1.14 pipeline running our engines.

    transport in -> STT -> user aggregator -> LLM -> TTS -> transport out -> assistant aggregator

`run_pipecat_session` is the Pipecat peer of `run_livekit_session`: the same faster-whisper,
diffusion LM and Piper engines (`stt_whisper`, `llm_diffusion`, `tts_piper`), the call fed at
real-time pace and the agent's audio kept on the call's timeline, and Pipecat's own turn
handling with its defaults, as the quickstart sets it up:

- ``LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(
  vad_analyzer=SileroVADAnalyzer()))``, nothing else set;
- VAD: `SileroVADAnalyzer` with default `VADParams`: confidence 0.7, start_secs 0.2,
  stop_secs 0.2, min_volume 0.6 (in the user aggregator, Pipecat 1.x's place for it);
- user turn strategies: the defaults of `UserTurnStrategies()`: start on
  `VADUserTurnStartStrategy` or `TranscriptionUserTurnStartStrategy`; stop by
  `TurnAnalyzerUserTurnStopStrategy(turn_analyzer=LocalSmartTurnAnalyzerV3())`, which runs
  Smart Turn v3.2 (the bundled ``smart-turn-v3.2-cpu.onnx``, 1 thread, threshold 0.5) on up
  to 8 s of the turn when the VAD stops (after 0.2 s of quiet), with default `SmartTurnParams`
  (stop_secs 3.0: an incomplete verdict ends the turn after 3 s of silence anyway,
  pre_speech_ms 500, max_duration_secs 8), and waits for the final transcript;
- `LLMUserAggregatorParams` defaults otherwise: user_turn_stop_timeout 5.0,
  audio_idle_timeout 1.0, no user mute strategies; interruptions on (Pipecat's default);
- STT: segmented, as Pipecat's local `WhisperSTTService` (0.5 s of trailing silence per
  segment, ``ttfs_p99_latency`` = `WHISPER_TTFS_P99`, no_speech_prob 0.4).

Not Pipecat's defaults: RTVI is off (no client to talk to), both sample rates are 16 kHz, and
the LM gets the same per-reply budget as in the LiveKit peer (four times
``budgets.llm_block_ms``) so that the engines, not their budgets, are the same on both sides.

Gaps are measured as in the LiveKit peer: from the end of the last 20 ms frame webrtcvad calls
voiced before each reply to the reply's first sample on the speaker. Benches should judge the
returned ``agent_audio`` against the call's ground truth instead (`tests.ground_truth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.workers.runner import WorkerRunner

from pipelines.config import AgentConfig
from pipelines.peer_replay import PeerTurn, gaps, voiced_frame_ends
from pipelines.pipecat_peer.llm_diffusion import DiffusionLLMService
from pipelines.pipecat_peer.stt_whisper import WhisperSegmentedSTT
from pipelines.pipecat_peer.transports import RATE, PacedOutputTransport, ReplayInputTransport
from pipelines.pipecat_peer.tts_piper import PiperTTSService


@dataclass
class _Said:
    user: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, the turn's text) at its end
    # (the reply's text as played, interrupted): the assistant aggregator's turns
    heard: list[tuple[str, bool]] = field(default_factory=list)


def build_pipeline(
    agent_engines: Any, mic: ReplayInputTransport, speaker: PacedOutputTransport, llm_deadline_s: float
) -> tuple[Pipeline, Any, Any, DiffusionLLMService]:
    """Our engines in Pipecat's standard voice pipeline, with its default turn handling.
    Returns the pipeline, the user and assistant aggregators and the LLM service."""
    context = LLMContext()
    user_agg, assistant_agg = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer())
    )
    llm = DiffusionLLMService(agent_engines.responder, deadline_s=llm_deadline_s)
    stt, tts = WhisperSegmentedSTT(agent_engines.asr_engine), PiperTTSService(agent_engines.tts)
    pipeline = Pipeline([mic, stt, user_agg, llm, tts, speaker, assistant_agg])
    return pipeline, user_agg, assistant_agg, llm


async def run_pipecat_session(
    agent_engines: Any,
    pcm16k: np.ndarray,
    *,
    cfg: AgentConfig | None = None,
    tail_s: float = 4.0,
    llm_deadline_s: float | None = None,
    keep_audio: bool = True,
) -> dict[str, Any]:
    """Replay ``pcm16k`` (int16, 16 kHz) through a Pipecat pipeline running our engines, at
    real-time pace. ``agent_engines``: anything with ``asr_engine``, ``responder`` and ``tts``
    (a loaded `pipelines.agent.Agent`). The session runs ``tail_s`` past the recording, longer
    while the agent is still speaking.

    Returns ``{"turns": [PeerTurn as dict], "gaps_ms": [...], "user_transcripts": [...],
    "agent_replies": [every reply decoded], "heard_replies": [{"text": what of a reply was
    played, "interrupted": bool}], "agent_audio_s": float, "errors": [...], "agent_audio": 16 kHz
    int16 aligned with the call, as long as the call plus ``tail_s`` + 5 s (keep_audio)}``.
    """
    cfg = cfg or getattr(agent_engines, "cfg", None) or AgentConfig()
    if llm_deadline_s is None:
        llm_deadline_s = max(0.005, cfg.budgets.llm_block_ms * 4 / 1000)
    mic = ReplayInputTransport(pcm16k)
    speaker = PacedOutputTransport(buffer_s=cfg.output.buffer_ms / 1000)
    pipeline, user_agg, assistant_agg, llm = build_pipeline(agent_engines, mic, speaker, llm_deadline_s)
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    said = _Said()
    errors: list[str] = []

    @user_agg.event_handler("on_user_turn_stopped")
    async def _on_user(_agg: Any, _strategy: Any, message: Any) -> None:
        said.user.append((time.monotonic(), (message.content or "").strip()))

    @assistant_agg.event_handler("on_assistant_turn_stopped")
    async def _on_agent(_agg: Any, message: Any) -> None:
        said.heard.append(((message.content or "").strip(), bool(message.interrupted)))

    @worker.event_handler("on_pipeline_error")
    async def _on_error(_worker: Any, frame: Any) -> None:
        errors.append(str(getattr(frame, "error", frame)))

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.ensure_future(runner.run())
    try:
        fed = asyncio.ensure_future(mic.finished.wait())
        await asyncio.wait([fed, running], return_when=asyncio.FIRST_COMPLETED)
        fed.cancel()
        if running.done():  # the pipeline ended before the call did
            running.result()
            raise RuntimeError(f"the Pipecat pipeline stopped early: {errors}")
        await asyncio.sleep(tail_s)
        await asyncio.sleep(max(0.0, speaker.play_end + 0.5 - time.monotonic()))  # a reply still playing
    finally:
        await worker.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 10)
    assert mic.t0 is not None
    t0 = mic.t0
    onsets = [o - t0 for o in speaker.onsets]
    pairs = gaps(onsets, voiced_frame_ends(pcm16k, cfg.vad.aggressiveness))
    turns: list[PeerTurn] = []
    prev_commit = -1.0
    replies = [(at - t0, text) for at, text in llm.replies]
    for user_end, start in pairs:
        commits = [(at - t0, text) for at, text in said.user if prev_commit < at - t0 <= start]
        commit = commits[-1][0] if commits else None
        # the reply that was playing: the last one decoded before its first sound
        agent_text = next((text for at, text in reversed(replies) if at <= start), "")
        turns.append(PeerTurn(
            round(user_end, 3), round(start, 3), round((start - user_end) * 1000, 1),
            " ".join(text for _, text in commits), agent_text,
            round(commit, 3) if commit is not None else None,
            commit is not None and commit >= user_end,
        ))
        if commit is not None:
            prev_commit = commit
    out: dict[str, Any] = {
        "turns": [asdict(t) for t in turns],
        "gaps_ms": [t.gap_ms for t in turns],
        "user_transcripts": [text for _, text in said.user],
        "agent_replies": [text for _, text in llm.replies],
        "heard_replies": [{"text": text, "interrupted": cut} for text, cut in said.heard],
        "agent_audio_s": round(sum(len(p) for _, p in speaker.chunks) / RATE, 3),
        "errors": errors,
    }
    if keep_audio:
        out["agent_audio"] = speaker.audio(t0, len(pcm16k) / RATE + tail_s + 5)
    return out

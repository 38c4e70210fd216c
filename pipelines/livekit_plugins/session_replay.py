"""Replay a recorded call through a real livekit-agents `AgentSession`, with no room.

`ReplayAudioInput` feeds the recording at real-time pace as 20 ms `rtc.AudioFrame`s;
`PacedAudioOutput` plays the agent's audio out on a simulated real-time speaker and notes
when each reply starts. `run_livekit_session` wires our STT/LLM/TTS plugins into an
`AgentSession` with LiveKit's default turn handling (silero VAD, its turn detector, 0.5 s
minimum endpointing delay, preemptive generation) and measures, per turn, the gap from the
end of the caller's speech to the first agent audio out: the same gap our own pipeline
reports, so the two can be compared side by side (bench/turn_gap.py).

End of caller speech is the end of the last 20 ms frame webrtcvad calls voiced before the
reply started, with the same VAD settings as our pipeline. Each reply also records when
LiveKit committed its user turn and whether that turn held a final transcript that arrived
after the caller's last voiced frame (``whole_turn``): LiveKit may commit at a mid-sentence
pause and hold the reply until the caller stops, and such a reply starts soon after the
caller's last word but answers only the words before the pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import Agent as LkAgent
from livekit.agents import AgentSession
from livekit.agents.voice import io

from pipelines.config import AgentConfig
from pipelines.livekit_plugins.llm_diffusion import DiffusionLLM
from pipelines.livekit_plugins.stt_whisper import WhisperSTT, rtc_frame_to_mono
from pipelines.livekit_plugins.tts_piper import PiperStreamingTTS
from pipelines.peer_replay import PeerTurn, gaps, played_track, voiced_frame_ends
from voice.audio import resample

log = logging.getLogger(__name__)
RATE = 16000
FRAME = RATE // 50  # 20 ms


class ReplayAudioInput(io.AudioInput):
    """A recording as a live microphone: frame i is handed over when it has been "spoken",
    at ``t0 + (i + 1) * 20 ms``; then silence until `stop`."""

    def __init__(self, pcm16k: np.ndarray) -> None:
        super().__init__(label="replay")
        self.pcm = pcm16k.astype(np.int16, copy=False)
        self.t0: float | None = None
        self.finished = asyncio.Event()  # the whole recording was handed over
        self._i = 0
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True

    async def __anext__(self) -> rtc.AudioFrame:
        if self._stopped:
            raise StopAsyncIteration
        if self.t0 is None:
            self.t0 = time.monotonic()
        due = self.t0 + (self._i + 1) * FRAME / RATE
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        chunk = self.pcm[self._i * FRAME : (self._i + 1) * FRAME]
        if len(chunk) < FRAME:
            self.finished.set()
            chunk = np.pad(chunk, (0, FRAME - len(chunk)))
        self._i += 1
        return rtc.AudioFrame(chunk.tobytes(), RATE, 1, FRAME)


class PacedAudioOutput(io.AudioOutput):
    """A speaker that plays in real time: audio captured faster than real time queues up.

    Records every reply's start (monotonic seconds) and the audio itself, placed on the
    timeline at 16 kHz, so tests can listen to what the caller would have heard. Like
    LiveKit's own sinks, a segment's end (played out, or cut by `clear_buffer`) is reported
    by a task started at `flush`.

    ``buffer_s`` is the playout buffer before the caller hears a frame, as our own output has
    (`output.buffer_ms`), so both pipelines' gaps are measured to the same point.
    """

    def __init__(self, buffer_s: float = 0.0) -> None:
        super().__init__(label="paced", capabilities=io.AudioOutputCapabilities(pause=False), sample_rate=None)
        self.buffer_s = buffer_s
        self.onsets: list[float] = []
        self.chunks: list[tuple[float, np.ndarray]] = []  # (start, 16 kHz pcm)
        self._play_end = 0.0
        self._seg_start: float | None = None
        self._seg_duration = 0.0
        self._cleared = asyncio.Event()
        self._cleared_at = 0.0
        self._finish: asyncio.Task[None] | None = None

    @property
    def play_end(self) -> float:
        return self._play_end

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self._seg_start is None:
            if self._finish is not None and not self._finish.done():
                await self._finish  # the previous segment reports its end first
            now = time.monotonic()
            start = max(now + self.buffer_s, self._play_end)
            self._seg_start, self._seg_duration = start, 0.0
            self._cleared.clear()
            self.onsets.append(start)
            self.on_playback_started(created_at=time.time() + (start - now))
        at = max(time.monotonic() + self.buffer_s, self._play_end)
        pcm = resample(rtc_frame_to_mono(frame), frame.sample_rate, RATE)
        self.chunks.append((at, pcm))
        self._play_end = at + frame.duration
        self._seg_duration += frame.duration

    def flush(self) -> None:
        super().flush()
        if self._seg_start is None:
            return
        self._finish = asyncio.ensure_future(self._report_end(self._seg_start, self._seg_duration))
        self._seg_start = None

    async def _report_end(self, start: float, duration: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._cleared.wait(), max(0.0, start + duration - time.monotonic()))
        if self._cleared.is_set():
            played = max(0.0, min(self._cleared_at - start, duration))
            self.on_playback_finished(playback_position=played, interrupted=True)
        else:
            self.on_playback_finished(playback_position=duration, interrupted=False)

    def clear_buffer(self) -> None:
        now = time.monotonic()
        playing = self._finish is not None and not self._finish.done()
        if self._seg_start is None and not playing:
            return
        cut = now + self.buffer_s  # what is already in the playout buffer still plays
        self._cleared_at = cut
        self._cleared.set()
        self._truncate(cut)
        self._play_end = min(self._play_end, cut)

    def _truncate(self, now: float) -> None:
        kept = []
        for at, pcm in self.chunks:
            if at >= now:
                continue
            keep = int((now - at) * RATE)
            kept.append((at, pcm[:keep]))
        self.chunks = kept

    def audio(self, t0: float, duration_s: float) -> np.ndarray:
        """What the speaker played, as 16 kHz PCM on the input's timeline (0 = ``t0``)."""
        return played_track(self.chunks, t0, duration_s)


@dataclass
class _Transcript:
    user: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, final transcript)
    agent: list[tuple[float, str]] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)  # (monotonic) a user turn entered the chat


def livekit_plugins_for(
    agent_engines: Any, cfg: AgentConfig | None = None, llm_deadline_s: float | None = None
) -> tuple[WhisperSTT, DiffusionLLM, PiperStreamingTTS]:
    """Our three engines as LiveKit plugins. ``agent_engines``: anything with ``asr_engine``,
    ``responder`` and ``tts`` (a loaded `pipelines.agent.Agent`). LiveKit generates replies
    preemptively, so by default the LM gets what our pipeline gives a speculative block:
    four times ``budgets.llm_block_ms``."""
    cfg = cfg or getattr(agent_engines, "cfg", None) or AgentConfig()
    if llm_deadline_s is None:
        llm_deadline_s = max(0.005, cfg.budgets.llm_block_ms * 4 / 1000)
    return (
        WhisperSTT(agent_engines.asr_engine, asr=cfg.asr, vad=cfg.vad),
        DiffusionLLM(agent_engines.responder, deadline_s=llm_deadline_s),
        PiperStreamingTTS(agent_engines.tts),
    )


async def run_livekit_session(
    agent_engines: Any,
    pcm16k: np.ndarray,
    *,
    tail_s: float = 4.0,
    turn_handling: dict[str, Any] | None = None,
    cfg: AgentConfig | None = None,
    llm_deadline_s: float | None = None,
    keep_audio: bool = False,
) -> dict[str, Any]:
    """Replay ``pcm16k`` (int16, 16 kHz) through a livekit-agents `AgentSession` running our
    plugins, at real-time pace, and measure each turn's gap.

    ``turn_handling`` is passed to `AgentSession` as is; None keeps LiveKit's defaults. The
    session runs ``tail_s`` past the recording, longer while the agent is still speaking.
    Returns ``{"turns": [PeerTurn as dict], "gaps_ms": [...], "user_transcripts": [...],
    "agent_replies": [...], "agent_audio_s": float, "agent_audio": 16 kHz int16 (keep_audio)}``.
    """
    cfg = cfg or getattr(agent_engines, "cfg", None) or AgentConfig()
    stt, llm, tts = livekit_plugins_for(agent_engines, cfg, llm_deadline_s)
    kwargs: dict[str, Any] = {"stt": stt, "llm": llm, "tts": tts, "user_away_timeout": None}
    if turn_handling is not None:
        kwargs["turn_handling"] = turn_handling
    session: AgentSession = AgentSession(**kwargs)
    mic = ReplayAudioInput(pcm16k)
    speaker = PacedAudioOutput(buffer_s=cfg.output.buffer_ms / 1000)
    session.input.audio = mic
    session.output.audio = speaker
    said = _Transcript()
    errors: list[str] = []

    @session.on("user_input_transcribed")
    def _on_user(ev: Any) -> None:
        if ev.is_final and ev.transcript.strip():
            said.user.append((time.monotonic(), ev.transcript.strip()))

    @session.on("conversation_item_added")
    def _on_item(ev: Any) -> None:
        item = ev.item
        role = getattr(item, "role", None)
        if role == "assistant" and (item.text_content or "").strip():
            said.agent.append((time.monotonic(), item.text_content.strip()))
        elif role == "user":  # LiveKit adds the user's message when it commits the turn
            said.commits.append(time.monotonic())

    @session.on("error")
    def _on_error(ev: Any) -> None:
        errors.append(repr(getattr(ev, "error", ev)))

    await session.start(LkAgent(instructions="You are a helpful voice agent."), record=False)
    try:
        await mic.finished.wait()
        await asyncio.sleep(tail_s)
        # let a reply that is still playing finish
        await asyncio.sleep(max(0.0, speaker.play_end + 0.5 - time.monotonic()))
    finally:
        mic.stop()
        with contextlib.suppress(Exception):
            await session.aclose()
    assert mic.t0 is not None
    t0 = mic.t0
    onsets = [o - t0 for o in speaker.onsets]
    pairs = gaps(onsets, voiced_frame_ends(pcm16k, cfg.vad.aggressiveness))
    turns = []
    prev_commit = -1.0
    for k, (user_end, start) in enumerate(pairs):
        commits = [c - t0 for c in said.commits if c - t0 <= start]
        commit = commits[-1] if commits else start
        # the finals of this turn arrived after the previous commit, by this one
        finals = [(at - t0, t) for at, t in said.user if prev_commit < at - t0 <= commit]
        user_text = " ".join(t for _, t in finals)
        agent_text = said.agent[k][1] if k < len(said.agent) else ""  # one chat item per reply
        whole = bool(finals) and finals[-1][0] >= user_end
        turns.append(
            PeerTurn(round(user_end, 3), round(start, 3), round((start - user_end) * 1000, 1), user_text, agent_text,
                        round(commit, 3) if commits else None, whole)
        )
        prev_commit = max(prev_commit, commit)
    total = sum(len(p) for _, p in speaker.chunks) / RATE
    out: dict[str, Any] = {
        "turns": [t.__dict__ for t in turns],
        "gaps_ms": [t.gap_ms for t in turns],
        "user_transcripts": [t for _, t in said.user],
        "agent_replies": [t for _, t in said.agent],
        "agent_audio_s": round(total, 3),
        "errors": errors,
    }
    if keep_audio:
        out["agent_audio"] = speaker.audio(t0, len(pcm16k) / RATE + tail_s + 5)
    return out

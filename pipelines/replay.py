"""Replay a recorded call through a live agent session, at real-time pace or as fast as the
pipeline takes it, and write the two-channel OUT.wav and the report."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.transport import AudioClock, RealtimeClock
from voice.audio import AudioFrame, AudioInputError, check_input_rate, read_wav, write_wav
from voice.transports.replay import TimelineOutput

TAIL_S = 2.5  # silence fed after the file so the last turn can end and be answered


async def replay_pcm(
    agent: Any, pcm: np.ndarray, rate: int, fast: bool = False, frame_ms: int | None = None,
    vanish_at_s: float | None = None, seat: Any = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """Feed ``pcm`` (int16 mono at ``rate``) to a new session, holding ``seat`` (from
    `Agent.admit`; none: a counted one). Returns (report, agent track). With ``vanish_at_s``
    the caller disappears then, mid-call: no more audio, and the session is closed as a
    transport closes it when its peer is gone (reason ``peer_gone``)."""
    try:
        check_input_rate(rate)
    except AudioInputError:
        if seat is not None:
            seat.release()  # the call is refused before it began: its seat is free again
        raise
    cfg = agent.cfg
    frame_ms = frame_ms or cfg.audio.frame_ms
    clock = AudioClock() if fast else RealtimeClock()
    duration = len(pcm) / rate
    output = TimelineOutput(rate, clock, cfg.output.buffer_ms, capacity_s=duration + TAIL_S + 30.0)
    session = agent.new_session(output, clock, "replay", seat=seat)
    await session.start()
    n = rate * frame_ms // 1000
    total = len(pcm) + int(TAIL_S * rate)
    padded = np.concatenate([pcm, np.zeros(total - len(pcm), dtype=np.int16)])
    t0 = time.monotonic()
    for k, i in enumerate(range(0, total - n + 1, n)):
        ts = i / rate
        if (vanish_at_s is not None and ts >= vanish_at_s) or session.hangup_requested.is_set():
            break
        if not fast:
            delay = t0 + ts + n / rate - time.monotonic()  # a frame exists once it has been captured
            if delay > 0:
                await asyncio.sleep(delay)
        await session.push_audio(AudioFrame(padded[i : i + n], rate, ts))
        if fast:
            await session.idle()
        elif k % 50 == 0:
            await asyncio.sleep(0)
    if session.hangup_requested.is_set():  # the agent hung up (a silent caller, an operator)
        reason = "agent_hangup"
    elif vanish_at_s is not None and vanish_at_s < total / rate:
        reason = "peer_gone"
    else:
        reason = "completed"
    report = await session.close(reason)
    if not fast:
        # let queued agent audio finish on the real clock before the track is cut
        await asyncio.sleep(max(0.0, output.busy_until() - clock.now()))
    report["call"]["mode"] = "fast" if fast else "realtime"
    return report, output.track


async def replay_file(
    agent: Any, in_path: str | Path, out_path: str | Path | None = None, fast: bool = False
) -> dict[str, Any]:
    pcm, rate = read_wav(in_path)
    report, track = await replay_pcm(agent, pcm, rate, fast=fast)
    report["call"]["input"] = str(in_path)
    report["call"]["input_duration_s"] = round(len(pcm) / rate, 3)
    if out_path is not None:
        write_two_channel(out_path, pcm, track, rate)
    return report


def write_two_channel(path: str | Path, caller: np.ndarray, agent: np.ndarray, rate: int) -> None:
    """Channel 0: the caller, exactly the input. Channel 1: the agent as the caller hears it."""
    end = np.nonzero(agent)[0]
    length = max(len(caller), int(end[-1]) + 1 if len(end) else 0)
    out = np.zeros((length, 2), dtype=np.int16)
    out[: len(caller), 0] = caller
    out[: min(length, len(agent)), 1] = agent[:length]
    write_wav(path, out, rate)

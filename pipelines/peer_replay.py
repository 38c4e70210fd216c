"""What the bench's replay peers (LiveKit Agents, Pipecat) share: their speaker's played audio
laid on the call's timeline, and the gap as a webrtcvad-based ruler reads it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voice.vad import WebRtcVad

RATE = 16000
FRAME = RATE // 50  # 20 ms


@dataclass
class PeerTurn:
    """One reply of a peer framework, paired with the caller's turn it answers."""

    user_end_s: float
    agent_start_s: float
    gap_ms: float
    user_text: str = ""
    agent_text: str = ""
    committed_s: float | None = None  # when the framework ended the user turn this reply answers
    # the user turn was ended after the caller's last voiced frame. False: the framework ended
    # it at a mid-sentence pause (and may have held the reply while the caller went on); the
    # reply answers only the words before the pause ("He was not an"), and its short gap is no
    # answer to the turn
    whole_turn: bool = True


def played_track(chunks: list[tuple[float, np.ndarray]], t0: float, duration_s: float) -> np.ndarray:
    """16 kHz PCM chunks played at monotonic times, as one track on the input's timeline
    (0 = ``t0``), ``duration_s`` long."""
    out = np.zeros(int(duration_s * RATE), np.int16)
    for at, pcm in chunks:
        i = int(round((at - t0) * RATE))
        if i >= len(out) or i + len(pcm) <= 0:
            continue
        seg = pcm[max(0, -i) : len(out) - i]
        out[max(0, i) : max(0, i) + len(seg)] = seg
    return out


def voiced_frame_ends(pcm16k: np.ndarray, aggressiveness: int = 2) -> np.ndarray:
    """End time (s) of every 20 ms frame webrtcvad calls speech."""
    vad = WebRtcVad(aggressiveness, RATE, 20)
    n = len(pcm16k) // FRAME
    return np.array([(i + 1) * FRAME / RATE for i in range(n) if vad.is_speech(pcm16k[i * FRAME : (i + 1) * FRAME])])


def gaps(onsets_s: list[float], voiced_ends: np.ndarray) -> list[tuple[float, float]]:
    """(user speech end, agent start) per reply. A reply counts only when the caller spoke
    since the previous one (a reply split in two segments is one reply)."""
    out: list[tuple[float, float]] = []
    prev_end = -1.0
    for onset in onsets_s:
        before = voiced_ends[voiced_ends <= onset]
        if len(before) == 0 or before[-1] <= prev_end:
            continue
        out.append((float(before[-1]), onset))
        prev_end = float(before[-1])
    return out

"""Where sound is audible, from frame energy: the caller's last audible sample before a VAD
decision, and the first audible sample of a synthesised reply.

webrtcvad's last voiced frame ends 0-220 ms after the caller's last audible sample (its
hangover, and on phone audio more), and Piper's first sample comes 0-50 ms before its first
audible one, so a gap taken between those two points is not the gap a caller hears. These
estimates move both ends to where the sound is, with the rule a listener's ruler uses: within
``floor_db`` of the loudest 10 ms frame, and over the quietest tenth of frames (a line's noise
floor or a recording's room tone is not speech) by a margin (`gate_db`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

FRAME_S = 0.01


def frame_db(pcm: np.ndarray, rate: int) -> np.ndarray:
    n = max(1, int(rate * FRAME_S))
    k = len(pcm) // n
    if k == 0:
        return np.zeros(0)
    x = pcm[: k * n].astype(np.float64).reshape(k, n)
    return 20 * np.log10(np.sqrt((x * x).mean(axis=1)) + 1e-9)


def first_audible_offset(pcm: np.ndarray, rate: int, floor_db: float = 40.0) -> float:
    """Seconds from the first sample of ``pcm`` to its first audible 10 ms frame."""
    db = frame_db(pcm, rate)
    if len(db) == 0:
        return 0.0
    loud = np.nonzero(db >= db.max() - floor_db)[0]
    return float(loud[0] * FRAME_S) if len(loud) else 0.0


class LevelTrack:
    """The levels of the last ``keep_s`` of caller audio, 10 ms at a time (long enough to hold
    the line's quiet moments, whose level is the noise floor)."""

    def __init__(self, keep_s: float = 10.0, noise_share: float | None = None) -> None:
        self.noise_share = noise_share  # `gate_db`
        self._frames: deque[tuple[float, float]] = deque(maxlen=int(keep_s / FRAME_S))  # (end time, dB)
        self._rest = np.zeros(0, np.int16)
        self._rest_t = 0.0

    def push(self, t: float, pcm: np.ndarray, rate: int) -> None:
        if len(self._rest):
            t, pcm = self._rest_t, np.concatenate([self._rest, pcm])
        n = int(rate * FRAME_S)
        whole = len(pcm) // n * n
        for i, db in enumerate(frame_db(pcm[:whole], rate)):
            self._frames.append((t + (i + 1) * FRAME_S, float(db)))
        self._rest, self._rest_t = pcm[whole:], t + whole / rate

    def last_audible(self, vad_end: float, floor_db: float = 40.0, lookback_s: float = 0.6,
                     lookahead_s: float = 0.3, gap_s: float = 0.15) -> float:
        """The end of the caller's last audible 10 ms frame around a VAD's end of speech
        ``vad_end``: back up to ``lookback_s`` before it (the VAD's hangover), or on up to
        ``lookahead_s`` after it through a quiet tail the VAD already called unvoiced, but
        not across ``gap_s`` of silence. ``vad_end`` itself when no frame qualifies."""
        frames = [(e, d) for e, d in self._frames if vad_end - lookback_s < e <= vad_end + lookahead_s]
        if not frames:
            return vad_end
        gate = gate_db(np.array([d for _, d in self._frames]), floor_db, self.noise_share)
        last = None
        for end, db in frames:
            if db < gate:
                continue
            if end > vad_end and last is not None and end - last > gap_s + FRAME_S:
                break  # sound after a real silence is not this turn's tail
            last = end
        return last if last is not None else vad_end


NOISE_MARGIN_DB = 10.0  # how far over the line's noise floor a frame must be to be speech


def gate_db(db: np.ndarray, floor_db: float, noise_share: float | None = None) -> float:
    """The level a 10 ms frame must reach to be speech, given the recent frames' levels ``db``:
    within ``floor_db`` of the loudest, and over the noise floor by NOISE_MARGIN_DB or, with a
    ``noise_share``, by that share of the line's range (loudest over floor), at most
    NOISE_MARGIN_DB. A clean line's range is 40-50 dB; in noise it shrinks, and a fixed 10 dB
    calls a caller's soft last syllables silence (at 15 dB SNR the pause started a median
    100-140 ms before their true end; `vad.noise_margin_share`, docs/turn-taking.md)."""
    loudest, floor = float(db.max()), _noise_floor(db)
    margin = NOISE_MARGIN_DB if noise_share is None else min(NOISE_MARGIN_DB, noise_share * (loudest - floor))
    return max(loudest - floor_db, floor + margin)


def _noise_floor(db: np.ndarray) -> float:
    """The quietest tenth of the frames that carry any signal (digital silence, as between
    the clips of a generated call, is no noise floor)."""
    live = db[db > 10.0]
    return float(np.percentile(live, 10)) if len(live) else -np.inf


class LevelGate:
    """Is a VAD frame loud enough to be the caller's speech? Within ``floor_db`` of the
    loudest 10 ms frame of the last ``keep_s`` and over the line's noise floor by a margin
    (`gate_db`, ``noise_share``), kept causally. webrtcvad calls a soft
    breath or a noisy line's hiss after the last word voiced for 100-500 ms; gated, the pause
    starts where the sound does. Frames the gate has not seen enough of (under ``warm_s``)
    pass."""

    def __init__(self, floor_db: float = 40.0, keep_s: float = 10.0, warm_s: float = 0.3,
                 noise_share: float | None = None) -> None:
        self.floor_db = floor_db
        self.noise_share = noise_share
        self._db: deque[float] = deque(maxlen=int(keep_s / FRAME_S))
        self._warm = int(warm_s / FRAME_S)
        self._gate = -np.inf
        self._since = 0

    def loud(self, pcm: np.ndarray, rate: int) -> bool:
        dbs = frame_db(pcm, rate)
        self._db.extend(float(d) for d in dbs)
        self._since += len(dbs)
        if len(self._db) < self._warm:
            return True
        if self._since >= 10 or self._gate == -np.inf:  # the floor moves slowly: every 100 ms
            self._gate = gate_db(np.fromiter(self._db, float), self.floor_db, self.noise_share)
            self._since = 0
        return bool(len(dbs)) and float(dbs.max()) >= self._gate


"""A ruler the pipeline does not hold: the caller's true end of speech from the source clip,
and the first audible agent sound in the output track, both by an energy gate.

- `speech_end`: the end of the last 10 ms frame of a clean clip within ``floor_db`` (40 dB)
  of its loudest frame and at least ``above_noise_db`` (10 dB) over the clip's own noise
  floor (its quietest tenth of frames; a recording's room tone is not speech): the caller's
  last audible sample, not a VAD's decision (webrtcvad's last voiced frame ends 0-220 ms
  later on phone audio, or earlier, inside a soft tail).
- `audible_onsets`: where agent audio becomes audible after at least ``quiet_s`` of quiet:
  the first 10 ms frame within ``floor_db`` of the track's loudest frame (Piper starts
  quietly: its first audible sample comes 0-50 ms after its first sample).
- `loud_from`: where a clean caller track (its frame levels, `levels_dbfs`) is next at or
  above a turn's energy gate (the caller speaking again after a pause, wherever the pause
  inserted into the call ends).
- `audible_until`: where agent audio that is audible at a time stops: the end of its last
  audible frame before ``quiet_s`` of quiet (how long a reply went on over the caller).
"""

from __future__ import annotations

import numpy as np

FRAME_S = 0.01


def _frame_db(pcm: np.ndarray, rate: int) -> np.ndarray:
    n = max(1, int(rate * FRAME_S))
    k = len(pcm) // n
    if k == 0:
        return np.zeros(0)
    x = pcm[: k * n].astype(np.float64).reshape(k, n)
    rms = np.sqrt((x * x).mean(axis=1)) + 1e-9
    return 20 * np.log10(rms)


def speech_end(pcm: np.ndarray, rate: int, floor_db: float = 40.0, above_noise_db: float = 10.0) -> float:
    """Seconds from the clip's start to its last audible sample."""
    db = _frame_db(pcm, rate)
    if len(db) == 0:
        return 0.0
    gate = max(db.max() - floor_db, _noise_floor(db) + above_noise_db)
    loud = np.nonzero(db >= gate)[0]
    return float((loud[-1] + 1) * FRAME_S) if len(loud) else 0.0


def audible_onsets(track: np.ndarray, rate: int, floor_db: float = 40.0, quiet_s: float = 0.2) -> list[float]:
    db = _frame_db(track, rate)
    if len(db) == 0 or db.max() < 20:  # an all-silent track (int16 RMS below 10)
        return []
    loud = db >= db.max() - floor_db
    out: list[float] = []
    last = -1e9
    for i in np.nonzero(loud)[0]:
        t = i * FRAME_S
        if t - last > quiet_s:
            out.append(float(t))
        last = t + FRAME_S
    return out


def first_audible_after(track: np.ndarray, rate: int, t: float, floor_db: float = 40.0) -> float | None:
    """The start of the first audible 10 ms frame of ``track`` at or after ``t`` (s)."""
    db = _frame_db(track, rate)
    if len(db) == 0:
        return None
    start = max(0, int(t / FRAME_S))
    loud = np.nonzero(db[start:] >= db.max() - floor_db)[0]
    return float((start + loud[0]) * FRAME_S) if len(loud) else None


def levels_dbfs(pcm: np.ndarray, rate: int) -> np.ndarray:
    """The level of each 10 ms frame of ``pcm`` in dB re int16 full scale (small: what
    `loud_from` reads, kept instead of a whole clean track)."""
    return (_frame_db(pcm, rate) - 20 * np.log10(32768.0)).astype(np.float32)


def loud_from(levels: np.ndarray, t: float, gate_dbfs: float) -> float | None:
    """The start (s) of the first 10 ms frame at or after ``t`` whose level (`levels_dbfs`) is
    at least ``gate_dbfs``; None when there is none."""
    start = max(0, int(round(t / FRAME_S)))
    loud = np.nonzero(levels[start:] >= gate_dbfs)[0]
    return float((start + loud[0]) * FRAME_S) if len(loud) else None


def audible_until(track: np.ndarray, rate: int, t: float, floor_db: float = 40.0, quiet_s: float = 0.6) -> float:
    """The end (s) of the audible sound of ``track`` that goes on at or after ``t``: the end of
    its last audible 10 ms frame before at least ``quiet_s`` of quiet (a reply's own pauses
    are shorter: Piper's between sentences run to about 0.3 s). ``t`` itself when nothing is
    audible from there for ``quiet_s``."""
    db = _frame_db(track, rate)
    start = max(0, int(t / FRAME_S))
    if len(db) <= start or db.max() < 20:
        return t
    loud = np.nonzero(db[start:] >= db.max() - floor_db)[0]
    end = t
    for i in loud:
        ft = (start + i) * FRAME_S
        if ft - end > quiet_s:
            break
        end = ft + FRAME_S
    return float(end)


def gaps_from_truth(utts: list[tuple[float, float]], onsets: list[float]) -> list[float | None]:
    """For each utterance (start, true end): ms from its true end to the first agent onset
    after its start and before the next utterance's start (None: no reply). An onset before
    the true end is a cut-off: its gap is negative."""
    out: list[float | None] = []
    for i, (start, end) in enumerate(utts):
        nxt = utts[i + 1][0] if i + 1 < len(utts) else float("inf")
        after = [o for o in onsets if start < o < nxt]
        out.append(round((after[0] - end) * 1000, 1) if after else None)
    return out


def _noise_floor(db: np.ndarray) -> float:
    """The quietest tenth of the frames that carry any signal (digital silence, as between
    the clips of a generated call, is no noise floor)."""
    live = db[db > 10.0]
    return float(np.percentile(live, 10)) if len(live) else -np.inf

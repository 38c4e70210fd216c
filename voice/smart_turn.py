"""Smart Turn v3.2: the probability that the caller's turn is over, from the sound alone.

An ~8 MB ONNX classifier (Whisper-tiny encoder and a small head, BSD-2-Clause, by Daily) over
the last 8 s of 16 kHz caller audio, trained on real turn ends in many languages. It hears
prosody: a falling pitch and a drawn-out last syllable say "done"; a level pitch before a
pause says "more to come". It cannot read the words, which the endpointer weighs beside it.

The model comes from the pipecat-ai 1.14.0 wheel (`scripts/fetch_models.py`); nothing is
downloaded at run time. One call runs in about 20 ms on one core here, so it is asked once
per pause, in a worker thread, never on the event loop.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice.workers import SHARED, EngineWorkers

RATE = 16000
WINDOW_S = 8.0
MODELS = Path(os.environ.get("VOICE_AGENT_MODELS", Path.home() / ".cache" / "voice-agent" / "models"))
DEFAULT_PATH = MODELS / "smart-turn-v3.2-cpu.onnx"


class SmartTurnMissing(FileNotFoundError):
    pass


@dataclass(frozen=True)
class TurnAudioVerdict:
    prob: float  # probability that the turn is complete
    ms: float  # time the model took


class SmartTurn:
    """``predict(audio)`` → the probability that the turn ends at the end of ``audio``
    (float32 in [-1, 1], 16 kHz, the turn so far including the silence after it). Thread-safe:
    one inference at a time per instance."""

    workers: EngineWorkers = SHARED  # where its calls run off the event loop (`voice.workers`)

    def __init__(self, path: Path | str | None = None, threads: int = 1) -> None:
        import onnxruntime as ort
        from transformers import WhisperFeatureExtractor

        p = Path(path) if path else DEFAULT_PATH
        if not p.is_file():
            raise SmartTurnMissing(f"Smart Turn model not found at {p}: run scripts/fetch_models.py (make setup)")
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(p), sess_options=so, providers=["CPUExecutionProvider"])
        self._features = WhisperFeatureExtractor(chunk_length=int(WINDOW_S))
        self._lock = threading.Lock()
        self.path = p

    def predict(self, audio: np.ndarray) -> float:
        return self.verdict(audio).prob

    def verdict(self, audio: np.ndarray) -> TurnAudioVerdict:
        if audio.ndim != 1:
            raise ValueError(f"expected mono audio, got shape {audio.shape}")
        n = int(WINDOW_S * RATE)
        x = np.asarray(audio, dtype=np.float32)[-n:]
        # the model was trained on turns padded at the front: the end must sit at the window's end
        x = np.pad(x, (n - len(x), 0)) if len(x) < n else x
        t0 = time.perf_counter()
        with self._lock:
            feats = self._features(
                x, sampling_rate=RATE, return_tensors="np", padding="max_length", max_length=n,
                truncation=True, do_normalize=True,
            ).input_features.astype(np.float32)
            out = self._session.run(None, {"input_features": feats})
        prob = float(np.asarray(out[0]).reshape(-1)[0])
        return TurnAudioVerdict(prob, (time.perf_counter() - t0) * 1000)

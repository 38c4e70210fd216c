"""Why the Pipecat peer misses turns: every segment its STT hears, beside the turns it missed.

    python bench/pipecat_misses.py [--split test] [--call test-003 ...]

Replays the calls through the Pipecat peer (`pipelines.pipecat_peer`, Pipecat's default turn
handling on our engines) at real-time pace, judges its audio as `bench/turn_gap.py` does, and
prints, per call, each turn of the truth with its gap (None: no reply after it) and every
segment the peer's STT transcribed: when it came back, its length (the segment with Pipecat's
pre-roll and 0.5 s of trailing silence), Whisper's text and no-speech probability, and whether
the peer dropped it (no_speech_prob at or over Pipecat's 0.4). A turn with no segment was
never started by Pipecat's Silero VAD.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval_calls import load_calls  # noqa: E402
from turn_gap import judge  # noqa: E402

from voice.audio import read_wav, resample  # noqa: E402

RATE = 16000


async def run(split: str, ids: list[str]) -> None:
    from loguru import logger  # Pipecat logs every frame at DEBUG

    from pipelines.agent import Agent
    from pipelines.config import AgentConfig
    from pipelines.pipecat_peer import run_pipecat_session
    from pipelines.pipecat_peer.stt_whisper import NO_SPEECH_PROB

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    agent = await Agent.load(AgentConfig())
    engine = agent.asr_engine
    transcribe = engine.transcribe
    heard: list[tuple[float, float, str, float]] = []
    t0 = 0.0

    def logged(audio: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        res = transcribe(audio, *args, **kwargs)
        heard.append((time.monotonic() - t0, len(audio) / RATE, res.text.strip(), res.no_speech_prob))
        return res

    engine.transcribe = logged  # type: ignore[method-assign]
    missed = 0
    try:
        for call in load_calls(split):
            if ids and call["id"] not in ids:
                continue
            pcm, rate = read_wav(call["wav"])
            heard.clear()
            t0 = time.monotonic()
            res = await run_pipecat_session(agent, pcm if rate == RATE else resample(pcm, rate, RATE), cfg=agent.cfg)
            judged = judge(res["agent_audio"], RATE, call["truth"]["turns"])
            print(f"{call['id']} ({rate} Hz)")
            for turn, j in zip(call["truth"]["turns"], judged, strict=True):
                miss = not j["replied"]  # no onset inside the turn or after it: turn_gap's "missed"
                missed += miss
                print(f"  {'MISSED ' if miss else '       '}{turn['start_s']:6.2f}-{turn['end_s']:6.2f} s "
                      f"{turn['text']!r}: gap {j['gap_ms']} ms")
            for t, seconds, text, p in heard:
                print(f"    STT back at {t:6.2f} s, {seconds:.2f} s of audio: {text!r}, no-speech {p:.3f}"
                      f"{' (dropped)' if p >= NO_SPEECH_PROB else ''}")
    finally:
        engine.transcribe = transcribe  # type: ignore[method-assign]
        await agent.aclose()
    print(f"missed: {missed}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="test", choices=("dev", "test"))
    ap.add_argument("--call", nargs="*", default=[], help="only these call ids (default: every call of the split)")
    args = ap.parse_args(argv)
    asyncio.run(run(args.split, args.call))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Redraw the README's pictures from the current code (CPU-heavy: a real-time replay of the
# 29 s example call and a browser call; run on an otherwise idle machine, after `make setup`).
#   docs/timeline.png  per-turn timeline of examples/call.wav (voice-agent replay + report --plot)
#   docs/webrtc.png    the WebRTC call page mid-call (scripts/webrtc_screenshot.py)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

mkdir -p /tmp/fig
.venv/bin/voice-agent replay examples/call.wav --out /tmp/fig/out.wav --report /tmp/fig/report.json
.venv/bin/voice-agent report /tmp/fig/report.json --plot docs/timeline.png

.venv/bin/python scripts/webrtc_screenshot.py --out docs/webrtc.png --wav examples/call.wav

#!/usr/bin/env bash
# Set up a fresh machine: Debian peers, the virtual environment, and the cached test speech.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

apt_install() {
    local want missing=()
    want=$(grep -v '^\s*#' scripts/apt-packages.txt | awk 'NF{print $1}')
    for p in $want; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if ((${#missing[@]})); then
        echo "setup: installing Debian packages: ${missing[*]}"
        local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

if [ "${SKIP_APT:-0}" != 1 ]; then apt_install; fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PY" -m venv "$VENV"
fi
# torch==2.13.0 is pinned so pip takes the CPU wheel on disk instead of a CUDA build.
"$VENV/bin/pip" install -q --disable-pip-version-check -e ".[train,webrtc,livekit,remote,serving,pipecat,test]"
# Pipecat without its dependencies, which would downgrade protobuf and soxr under livekit-agents;
# the [pipecat] extra above holds the ones it needs (docs/pipecat.md).
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "pipecat-ai==1.14.0"
"$VENV/bin/python" scripts/fetch_speech.py
"$VENV/bin/python" scripts/fetch_models.py

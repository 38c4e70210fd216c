#!/usr/bin/env bash
# Run lint and the whole test suite. Services the tests need (mosquitto, sipp, chromium)
# are started by the test fixtures themselves on free loopback ports.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$VENV/bin/ruff" check . || exit 1
"$VENV/bin/python" -m pytest -q -ra "$@"
rc=$?
if [ "$rc" = 5 ]; then echo "no tests ran"; exit 1; fi
exit $rc

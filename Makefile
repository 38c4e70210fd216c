VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench clean

setup:
	bash scripts/setup.sh

# Main job: replay the bundled call through the real embedded models at real-time pace.
demo: setup
	$(VENV)/bin/voice-agent replay examples/call.wav --out out.wav --report report.json
	$(VENV)/bin/voice-agent report report.json

test: setup
	bash scripts/run_tests.sh

lint:
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) bench/llm_throughput.py
	$(PY) bench/turn_gap.py

clean:
	rm -rf out.wav report.json .pytest_cache

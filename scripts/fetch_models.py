"""Fetch the models that come from registry packages but are not Python imports (idempotent).

- Smart Turn v3.2 (BSD-2-Clause, Daily): the ONNX end-of-turn classifier shipped inside the
  pipecat-ai 1.14.0 wheel on PyPI (`pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx`).
  Only the model file and the wheel's license are kept; pipecat itself is not installed.

Nothing here is committed; the cache lives in $VOICE_AGENT_MODELS or ~/.cache/voice-agent/models.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("VOICE_AGENT_MODELS", Path.home() / ".cache" / "voice-agent" / "models"))
WHEEL = ("pipecat-ai", "1.14.0")
MEMBERS = {
    "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx": "smart-turn-v3.2-cpu.onnx",
    "pipecat_ai-1.14.0.dist-info/licenses/LICENSE": "smart-turn-LICENSE.txt",
}


def _download_wheel(name: str, version: str, into: Path) -> Path:
    """pip downloads from the configured index and checks the index's hash."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
         "--only-binary", ":all:", f"{name}=={version}", "-d", str(into)],
        check=True,
    )
    return next(into.glob("*.whl"))


def fetch_smart_turn() -> Path:
    dest = CACHE / "smart-turn-v3.2-cpu.onnx"
    if dest.exists() and (CACHE / "smart-turn-LICENSE.txt").exists():
        return dest
    name, version = WHEEL
    print(f"fetch_models: downloading the {name}-{version} wheel for Smart Turn v3.2", flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(_download_wheel(name, version, Path(tmp))) as zf:
        for member, target in MEMBERS.items():
            part = CACHE / f".{target}.part"
            part.write_bytes(zf.read(member))
            part.replace(CACHE / target)
    return dest


def main() -> int:
    path = fetch_smart_turn()
    print(f"fetch_models: Smart Turn v3.2 at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real OpenAI-compatible server for the remote-LM tests: `transformers serve` (Hugging Face's,
from the ``transformers[serving]`` extra) serving the repo's AR baseline on loopback, offline.

The AR baseline (``llm/weights/ar``) has a bare `tokenizers` file and no chat template; the
server needs both, so a temporary copy gets a ``tokenizer_config.json`` whose template writes
the chat layout the model was trained on (``<bos> caller words <agent>``, the last user
message) and whose end token is ``<eot>``. The committed weights are not touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm.ar import AR_WEIGHTS

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' and loop.last %} "
    "{{ m['content'] | trim }}{% endif %}{% endfor %}<agent>"
)
SERVE = Path(sys.executable).with_name("transformers")


def served_copy(dest: Path) -> Path:
    """A copy of the AR baseline that `transformers serve` can load, in ``dest``."""
    shutil.copytree(AR_WEIGHTS, dest)
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eot>",
        "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE,
    }))
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TransformersServer:
    """One `transformers serve` process; `stop` kills it, `start` starts it again on the same port."""

    def __init__(self, model_dir: Path, log_path: Path, port: int | None = None) -> None:
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        return str(self.model_dir)

    def start(self, timeout_s: float = 90.0) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
               "OMP_WAIT_POLICY": "PASSIVE"}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(SERVE), "serve", "--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu",
             "--dtype", "float32", "--log-level", "warning", str(self.model_dir)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"transformers serve not up after {timeout_s} s: {self.log_tail()}")

    def stop(self) -> None:
        """Kill the server (SIGKILL: no graceful goodbye to clients mid-stream)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@pytest.fixture(scope="module", name="server")
def transformers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TransformersServer]:
    """`transformers serve` on the repo's AR baseline, one per test module."""
    d = tmp_path_factory.mktemp("served")
    srv = TransformersServer(served_copy(d / "ar"), d / "serve.log")
    srv.start()
    yield srv
    srv.stop()

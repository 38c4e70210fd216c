"""`voice-agent serve sip|webrtc` as a process: it comes up, and SIGTERM or SIGINT (a service
manager's stop, Ctrl-C) ends it cleanly with exit status 0 and its sockets closed."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mosquitto import free_port

ROOT = Path(__file__).resolve().parents[1]


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_line(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return line
    proc.kill()
    raise AssertionError(f"no {marker!r} from the server: {''.join(seen)[-2000:]}")


@pytest.mark.parametrize(
    ("transport", "sig"),
    [("sip", signal.SIGTERM), ("webrtc", signal.SIGINT)],
)
def test_server_stops_cleanly_on_a_signal(transport: str, sig: signal.Signals) -> None:
    if transport == "sip":
        port = _free_udp_port()
        argv = ["serve", "sip", "--bind", f"127.0.0.1:{port}"]
        marker = "SIP bridge listening"
    else:
        port = free_port()
        argv = ["serve", "webrtc", "--port", str(port), "--token", "t"]
        marker = "WebRTC calls: open"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_line(proc, marker, timeout_s=120)
        proc.send_signal(sig)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    # the port is free again: the server closed its socket on the way out
    kind = socket.SOCK_DGRAM if transport == "sip" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", port))

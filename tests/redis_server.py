"""A real redis-server on a free loopback port, for tests (like `tests.mosquitto`).

No persistence: a killed and restarted server starts empty, as a Redis that lost its memory
would. ``maxmemory`` with ``allkeys-lru`` bounds it the way docs/cache.md advises.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mosquitto import free_port
from tests.server_process import ServerProcess

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer(ServerProcess):
    def __init__(self, port: int | None = None, maxmemory: str = "64mb") -> None:
        if not os.path.exists(REDIS_SERVER):
            pytest.skip("redis-server is not installed (scripts/apt-packages.txt)")
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="redis-"))
        self.log = self.dir / "redis.log"
        self.args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru", "--dir", str(self.dir),
            "--protected-mode", "no", "--daemonize", "no",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 5.0) -> None:
        assert self.proc is None, "already running"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on {self.port}: {self.log.read_text()[-2000:]}")



@contextlib.contextmanager
def running_redis(maxmemory: str = "64mb") -> Iterator[RedisServer]:
    server = RedisServer(maxmemory=maxmemory)
    server.start()
    try:
        yield server
    finally:
        server.close()

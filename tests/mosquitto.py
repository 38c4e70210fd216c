"""A real mosquitto broker on a free loopback port, for tests.

``set_tcp_nodelay true`` matters: with Nagle on, mosquitto adds about 40 ms per message.
Persistence with an autosave on every change lets a test kill the broker with SIGKILL and
restart it without losing a durable subscriber's session: what the restarted broker
receives for that subscriber while it reconnects is queued for it, so the test's
delivered/dropped counts do not depend on who reconnects first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiomqtt
import pytest

from tests.server_process import ServerProcess

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mosquitto(ServerProcess):
    def __init__(self, port: int | None = None, tls: bool = False, nodelay: bool = True) -> None:
        if not os.path.exists(MOSQUITTO):
            pytest.skip("mosquitto is not installed (scripts/apt-packages.txt)")
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mosquitto-"))
        # mosquitto started as root drops to the `mosquitto` user, which must be able to save.
        self.dir.chmod(0o777)
        self.log = self.dir / "mosquitto.log"
        self.conf = self.dir / "mosquitto.conf"
        conf = (
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            f"set_tcp_nodelay {'true' if nodelay else 'false'}\n"
            "persistence true\n"
            f"persistence_location {self.dir}/\n"
            "autosave_on_changes true\n"
            "autosave_interval 1\n"
            "max_queued_messages 100000\n"
        )
        self.tls_port: int | None = None
        if tls:
            self.tls_port = free_port()
            self.ca = self._make_certs()
            conf += (
                f"listener {self.tls_port} 127.0.0.1\n"
                f"cafile {self.ca}\ncertfile {self.dir / 'server.pem'}\nkeyfile {self.dir / 'server.key'}\n"
            )
        self.conf.write_text(conf)
        self.proc: subprocess.Popen[bytes] | None = None

    def _make_certs(self) -> Path:
        """A throwaway CA and a server certificate for 127.0.0.1 (openssl CLI)."""
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("openssl is not installed")
        d = self.dir
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        for cmd in (
            ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca"],
            ["req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"],
            [
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "1",
                "-extfile",
                "san.ext",
            ],
        ):
            subprocess.run([openssl, *cmd], cwd=d, check=True, capture_output=True)
        (d / "server.key").chmod(0o644)  # read by the unprivileged `mosquitto` user
        return d / "ca.pem"

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self, timeout: float = 5.0) -> None:
        assert self.proc is None, "already running"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"mosquitto did not listen on {self.port}: {self.log.read_text()[-2000:]}")

    async def wait_persisted(self, collector: Collector, within_s: float = 5.0) -> None:
        """Until the broker's persistence file holds ``collector``'s durable session and its
        subscription: only then does that session survive a SIGKILL. (Waiting for the file's
        mtime to change was not enough: the periodic autosave could land between the
        subscriber's connect and its subscribe, and the restarted broker then had no session
        to queue the test's events for.)"""
        db = self.dir / "mosquitto.db"
        want = (collector.client_id.encode(), collector.topic.encode())
        deadline = time.monotonic() + within_s
        while True:
            data = db.read_bytes() if db.exists() else b""
            if all(w in data for w in want):
                return
            if time.monotonic() > deadline:
                raise AssertionError("mosquitto did not save the durable subscriber's session")
            await asyncio.sleep(0.01)



@contextlib.contextmanager
def running_mosquitto() -> Iterator[Mosquitto]:
    broker = Mosquitto()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


class Collector:
    """A real MQTT subscriber that records every message and reconnects when the broker dies.

    With ``durable=True`` it uses a persistent session (fixed client id, clean_session off,
    QoS 1), so a broker restarted from its persistence file queues messages for it.
    """

    def __init__(self, port: int, topic: str = "#", durable: bool = False) -> None:
        self.port = port
        self.topic = topic
        self.durable = durable
        self.client_id = f"collector-{os.getpid()}-{id(self):x}"
        self.messages: list[tuple[str, bytes, bool]] = []
        self.subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Collector:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.subscribed.wait(), 5)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            try:
                async with aiomqtt.Client(
                    "127.0.0.1",
                    self.port,
                    identifier=self.client_id,
                    clean_session=not self.durable,
                ) as client:
                    await client.subscribe(self.topic, qos=1)
                    self.subscribed.set()
                    async for m in client.messages:
                        payload = m.payload if isinstance(m.payload, bytes) else str(m.payload).encode()
                        self.messages.append((str(m.topic.value), payload, bool(m.retain)))
            except aiomqtt.MqttError:
                self.subscribed.clear()
                await asyncio.sleep(0.02)

    def json(self, suffix: str = "") -> list[dict]:
        return [json.loads(p) for t, p, _ in self.messages if t.endswith(suffix)]

    async def wait_for(self, pred: Callable[[Collector], bool], within_s: float = 5.0) -> None:
        deadline = time.monotonic() + within_s
        while not pred(self):
            if time.monotonic() > deadline:
                topics = [t for t, _, _ in self.messages[-20:]]
                raise AssertionError(f"timed out; {len(self.messages)} messages, last topics {topics}")
            await asyncio.sleep(0.005)

"""A peer server the tests start as a process (mosquitto, redis-server): killed without
goodbyes, restarted on the same port, and its scratch folder removed at the end."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path


class ServerProcess(ABC):
    proc: subprocess.Popen[bytes] | None
    dir: Path

    @abstractmethod
    def start(self) -> None:
        """Start the server and wait until it accepts connections."""

    def kill(self) -> None:
        """SIGKILL: the server dies as if the machine lost power, no goodbyes sent."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
            self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

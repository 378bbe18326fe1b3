"""What tests that start other programs or serve streams share: a program started with its output in a log file,
waited for until the log says it is ready, and stopped by its PID; free loopback ports; a one-connection server
of bytes written by hand. Not a test module: test modules import it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports on loopback that nothing listens on now (for a program the test starts)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def serve(data: bytes) -> int:
    """A one-connection server on loopback sending ``data``, then closing (a detector's stream written by hand); its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                try:
                    conn.sendall(data)
                except OSError:
                    pass  # the receiver stopped reading (an error it found): what it refused is its answer

    threading.Thread(target=run, daemon=True).start()
    return listener.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    """Stop a program the test started, by its PID: SIGTERM, then SIGKILL after 30 s."""
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()


class Started:
    """Programs a test starts (detector simulators), their output in log files in ``folder``; ``close`` stops them all."""

    def __init__(self, folder: Path):
        self.folder, self.processes = folder, []

    def start(self, command: list[str], ready: Callable[[str], T | None], what: str, timeout_s: float = 120,
              env: dict[str, str] | None = None) -> T:
        """Start ``command`` (in ``env``, else this one) and wait until ``ready(its log so far)`` gives a value (the
        ports it listens on), and return it."""
        log = self.folder / f"{what}-{len(self.processes)}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.processes.append(process)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = log.read_text()
            value = ready(text)
            if value is not None:
                return value
            assert process.poll() is None, f"{what} exited: {text[-2000:]}"
            time.sleep(0.2)
        raise AssertionError(f"{what} was not ready within {timeout_s:g} s")

    def close(self) -> None:
        for process in self.processes:
            stop(process)

"""Starting real `edgespec serve` / `edgespec bridge` processes for the tests, with bounded waits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"  # ignored by git


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def edgespec_command(command: str, *args: str) -> list[str]:
    # One llama.cpp thread per test process: on a shared two-core machine, two-thread processes beside other
    # busy work stall in llama.cpp's spinning thread barriers (we measured 100× slowdowns); one thread only
    # shares the CPU, and leaves a core to whoever else is running.
    return [sys.executable, "-m", "edgespec.cli", command, "--threads", "1", *args]


def child_env() -> dict[str, str]:
    # The child must run this checkout's edgespec, whatever is installed in the environment.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


class LiveServer:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.port = proc, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path: Path | None = None  # its stdout and stderr

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    @classmethod
    def start(cls, *args: str, timeout: float = 300.0) -> LiveServer:
        port = free_port()
        log = open(ARTIFACTS.joinpath(f"serve-{port}.log"), "wb")  # noqa: SIM115  (closed with the process)
        proc = subprocess.Popen(edgespec_command("serve", "--port", str(port), *args), cwd=ROOT, env=child_env(),
                                stdout=log, stderr=subprocess.STDOUT)
        server = cls(proc, port)
        server.log_path = Path(log.name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"edgespec serve exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        server.stop()
        raise RuntimeError(f"edgespec serve was not ready after {timeout} s; see {log.name}")

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def metric(self, line_prefix: str, headers: dict[str, str] | None = None) -> float:
        """The value of the first /metrics sample starting with ``line_prefix`` (0 when absent)."""
        text = httpx.get(self.url + "/metrics", headers=headers, timeout=5).text
        for line in text.splitlines():
            if line.startswith(line_prefix):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


ARTIFACTS.mkdir(exist_ok=True)

"""keydispenser processes for a drill, started through the real CLI."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class Fleet:
    log_dir: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _commands: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def spawn(self, name: str, command: str, extra_env: dict[str, str] | None = None) -> None:
        env = {**self.env, **(extra_env or {})}
        self._commands[name] = (command, env)
        log = (self.log_dir / f"{name}.log").open("ab")
        self._logs.append(log)
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "shared.cli", command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self, name: str) -> None:
        child = self.processes[name]
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait(10)

    def restart(self, name: str) -> None:
        self.kill(name)
        command, env = self._commands[name]
        self.spawn(name, command, {k: v for k, v in env.items() if k not in self.env})

    def stop(self) -> None:
        for child in self.processes.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.processes.values():
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for log in self._logs:
            log.close()


def wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
            if reply.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")

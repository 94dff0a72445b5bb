"""keydispenser processes for a drill, started through the real CLI."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from shared.ops.processes import stop_processes


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
            [sys.executable, "-m", "shared.ops.cli", command],
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
        stop_processes(self.processes.values())
        for log in self._logs:
            log.close()

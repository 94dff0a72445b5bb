"""keydispenser processes for a drill, started through the real CLI."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from shared.ops.processes import cli_command, kill_process, spawn, stop_processes


@dataclass
class Fleet:
    log_dir: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    exits: list[str] = field(default_factory=list)  # processes that died by themselves
    _commands: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)

    def spawn(self, name: str, command: str, extra_env: dict[str, str] | None = None) -> None:
        env = {**self.env, **(extra_env or {})}
        self._commands[name] = (command, env)
        self.processes[name] = spawn(cli_command(command), env, self.log_dir / f"{name}.log")

    def kill(self, name: str) -> None:
        kill_process(self.processes[name])

    def restart(self, name: str) -> None:
        self.kill(name)
        command, env = self._commands[name]
        self.spawn(name, command, {k: v for k, v in env.items() if k not in self.env})

    def restart_exited(self) -> list[str]:
        """Processes that exited without being killed: counted, then restarted so the
        drill goes on. Must stay empty: an outage is to be ridden out, never an exit."""
        gone = [name for name, child in self.processes.items() if child.poll() is not None]
        for name in gone:
            self.exits.append(name)
            self.restart(name)
        return gone

    def stop(self) -> None:
        stop_processes(self.processes.values())

"""keydispenser processes for a drill, started through the real CLI."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from keydispenser_ops.processes import cli_command, kill_process, spawn, stop_processes


@dataclass
class Fleet:
    log_dir: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    exits: list[str] = field(default_factory=list)  # processes that died by themselves
    # Processes whose exit is theirs to report (lease holders end when their lease does).
    expected_exits: set[str] = field(default_factory=set)
    # Each process's own settings on top of ``env`` (its links: links.py).
    overrides: dict[str, dict[str, str]] = field(default_factory=dict)
    _commands: dict[str, tuple[tuple[str, ...], dict[str, str]]] = field(default_factory=dict)

    def spawn(
        self,
        name: str,
        command: str,
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        env = {**self.env, **self.overrides.get(name, {}), **(extra_env or {})}
        self._commands[name] = ((command, *args), env)
        argv = cli_command(command, *args)
        # Ended with the drill, however it ends (its parent-death signal).
        self.processes[name] = spawn(argv, env, self.log_dir / f"{name}.log", die_with_parent=True)

    def kill(self, name: str) -> None:
        """SIGKILL the process, then its child processes (a dispenser's workers would
        otherwise go on serving, and holding their leases, without it)."""
        process = self.processes[name]
        workers = children(process.pid) if process.poll() is None else []
        kill_process(process)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def restart(self, name: str) -> None:
        self.kill(name)
        (command, *args), env = self._commands[name]
        extra = {k: v for k, v in env.items() if k not in self.env}
        self.spawn(name, command, extra, tuple(args))

    def restart_exited(self) -> list[str]:
        """Processes that exited without being killed: counted, then restarted so the
        drill goes on. Must stay empty: an outage is to be ridden out, never an exit."""
        gone = [
            name
            for name, child in self.processes.items()
            if child.poll() is not None and name not in self.expected_exits
        ]
        for name in gone:
            self.exits.append(name)
            self.restart(name)
        return gone

    def stop(self) -> None:
        stop_processes(self.processes.values())


def children(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (Linux)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found.extend(int(child) for child in task.read_text().split())
    return found

"""Child processes: starting them, stopping them, and waiting for one to serve."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

# Where a child's output goes: appended to a log file (both streams), this process's
# terminal, the terminal for stderr only (when our stdout carries a report), or nowhere.
Output = Path | Literal["inherit", "stderr_only", "discard"]


def cli_command(*args: str) -> list[str]:
    """``keydispenser ARGS`` run by this interpreter, so a child runs the same install
    as its parent whether or not the console script is on PATH."""
    return [sys.executable, "-m", "shared.cli", *args]


def scrubbed_env(**settings: str) -> dict[str, str]:
    """This process's environment without its ``KD_`` variables, plus ``settings``.

    A child configured this way sees only the configuration its parent chose for it,
    not whatever the operator's shell happens to export.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("KD_")}
    return env | settings


# prctl(2): the signal a process gets when its parent ends.
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> Callable[[], None]:
    """For ``preexec_fn``: SIGTERM the child when ``parent`` ends (SIGKILL, a crash),
    and end it at once if it already has."""

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    output: Output = "inherit",
    *,
    own_session: bool = False,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdin closed (no child waits on a terminal it cannot read).

    ``own_session``: out of the caller's process group, so a Ctrl-C at the terminal
    does not reach it; whoever started it stops it (servers outlive their clients).
    ``die_with_parent``: SIGTERMed when this process ends without stopping it (Linux's
    parent-death signal; only from the main thread, whose end it follows).
    """
    preexec = None
    if die_with_parent and threading.current_thread() is threading.main_thread():
        preexec = _die_with_parent(os.getpid())
    if isinstance(output, Path):
        # The child holds its own descriptor of the log; ours can close at once.
        with output.open("ab") as log:
            return subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=own_session,
                preexec_fn=preexec,
            )
    stdout = None if output == "inherit" else subprocess.DEVNULL
    stderr = subprocess.DEVNULL if output == "discard" else None
    return subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=own_session,
        preexec_fn=preexec,
    )


def run_cli(
    *args: str, env: Mapping[str, str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``keydispenser ARGS`` to completion; its output is captured as text."""
    return subprocess.run(
        cli_command(*args), env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def stop_processes(
    processes: Iterable[subprocess.Popen[bytes] | None], timeout_s: float = 15
) -> None:
    """SIGTERM every live process first (they shut down in parallel), then wait for
    each, SIGKILLing any still running after ``timeout_s``."""
    live = [p for p in processes if p is not None and p.poll() is None]
    for process in live:
        process.terminate()
    for process in live:
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop_process(process: subprocess.Popen[bytes] | None, timeout_s: float = 10) -> None:
    stop_processes([process], timeout_s)


def kill_process(process: subprocess.Popen[bytes] | None, timeout_s: float = 10) -> None:
    """SIGKILL ``process`` if it still runs, and reap it: a crash, not a shutdown."""
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout_s)


def listening(port: int, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> bool:
    """Poll until something accepts connections on loopback ``port`` (True), or
    ``timeout_s`` passes or ``process``, the server expected there, exits (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.05)
    return False


def serving(url: str, timeout_s: float, stopping: Callable[[], bool] = lambda: False) -> bool:
    """Poll ``url`` until it answers 200 (True) or ``timeout_s`` passes or ``stopping()``
    (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping():
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
            if reply.status == 200:
                return True
        time.sleep(0.1)
    return False


def types_not_serving(
    readyz_url: str, timeout_s: float, stopping: Callable[[], bool] = lambda: False
) -> list[str]:
    """Poll a dispenser's ``/readyz`` until every type has keys (returns []) or
    ``timeout_s`` passes or ``stopping()`` (returns the types still without, or
    ["dispenser"] when it never answered ready). One look when ``timeout_s`` is 0."""
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = ["dispenser"]
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(readyz_url, timeout=1) as reply,
        ):
            types = json.loads(reply.read())["types"]
            waiting = sorted(name for name, row in types.items() if row["state"] != "serving")
        if not waiting or time.monotonic() >= deadline or stopping():
            return waiting
        time.sleep(0.2)

"""A server started for a process (`keydispenser up`'s embedded PostgreSQL and Redis, a
test run's, a drill's) ends when that process ends, however it ends: SIGKILL, a closed
terminal, a crash. Stopped the normal way, the owner stops it itself; the reaper is for
every other way.

``watch(server)`` starts a small process of its own session (a Ctrl-C or a closed
terminal does not reach it) that waits, on pidfds, for either the owner or the server
to exit: the server first (stopped by its owner), it exits too; the owner first, it
sends the server its stop signal (PostgreSQL: SIGINT, a fast shutdown; Redis: SIGTERM),
SIGKILLs it if it is still there after ``GRACE_S``, and exits. The owner's parent-death
signal cannot do this: PostgreSQL's postmaster is not the owner's child (pg_ctl starts
it), and the signal follows the thread that forked, not the process.

Run as ``python -m keydispenser_ops.reaper OWNER SERVER SIGNAL``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from typing import Final

from keydispenser_ops.processes import spawn
from shared.runtime import pid_alive

GRACE_S: Final = 15.0


def watch(server: int, stop_signal: int = signal.SIGTERM) -> subprocess.Popen[bytes]:
    """A reaper for ``server`` on behalf of this process (``wait()`` it once the server
    is stopped: it exits by itself then)."""
    argv = [sys.executable, "-m", "keydispenser_ops.reaper", str(os.getpid()), str(server)]
    return spawn([*argv, str(int(stop_signal))], output="discard", own_session=True)


def reap(owner: int, server: int, stop_signal: int) -> str:
    """Wait for ``owner`` or ``server`` to exit; end ``server`` if ``owner`` went first.
    What happened: 'server exited', 'server stopped', 'server killed'."""
    try:
        owner_fd, server_fd = os.pidfd_open(owner), os.pidfd_open(server)
    except ProcessLookupError:  # one is gone already
        if pid_alive(server) and not pid_alive(owner):
            return _end(server, stop_signal)
        return "server exited"
    poller = select.poll()
    poller.register(owner_fd, select.POLLIN)
    poller.register(server_fd, select.POLLIN)
    ready = {fd for fd, _ in poller.poll()}
    if server_fd in ready:
        return "server exited"
    return _end(server, stop_signal, server_fd)


def _end(server: int, stop_signal: int, server_fd: int | None = None) -> str:
    with contextlib.suppress(ProcessLookupError):
        os.kill(server, stop_signal)
    if _gone(server, server_fd, GRACE_S):
        return "server stopped"
    with contextlib.suppress(ProcessLookupError):
        os.kill(server, signal.SIGKILL)
    return "server killed"


def _gone(pid: int, fd: int | None, timeout_s: float) -> bool:
    if fd is not None:
        return bool(select.select([fd], [], [], timeout_s)[0])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def main(argv: list[str]) -> int:
    # A Ctrl-C or a closed terminal ends the owner, not its reaper.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    owner, server, stop_signal = (int(a) for a in argv)
    reap(owner, server, stop_signal)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Child processes: stopping them, and waiting for one to serve HTTP."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterable


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


def serving(url: str, timeout_s: float) -> bool:
    """Poll ``url`` until it answers 200 (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
            if reply.status == 200:
                return True
        time.sleep(0.1)
    return False


def types_not_serving(readyz_url: str, timeout_s: float) -> list[str]:
    """Poll a dispenser's ``/readyz`` until every type has keys (returns []) or
    ``timeout_s`` passes (returns the types still without, or ["dispenser"] when it
    never answered ready). One look when ``timeout_s`` is 0."""
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = ["dispenser"]
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(readyz_url, timeout=1) as reply,
        ):
            types = json.loads(reply.read())["types"]
            waiting = sorted(name for name, row in types.items() if row["state"] != "serving")
        if not waiting or time.monotonic() >= deadline:
            return waiting
        time.sleep(0.2)

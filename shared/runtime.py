"""Process plumbing shared by keygen, keysync and dispenser: signals, backoff, whether a
process lives."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from shared.domain.errors import StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
FAULT_POINT_ENV = "KD_FAULT_POINT"  # test-only: the fault point at which to die (or stop)
FAULT_ARMED_ENV = "KD_FAULT_ARMED"  # test-only: a file whose presence arms it, once
FaultPoint = Callable[[str], None]


def no_fault(point: str) -> None:
    """The production fault point: does nothing."""


def fault_points_from_environ() -> FaultPoint:
    """Test-only: a hook that kills the process (as SIGKILL would) at the named point,
    or freezes it there (as SIGSTOP would) with ``:stop`` after the name.

    ``KD_FAULT_POINT=keysync.committed`` makes keysync die right after its first
    batch's DELETE commits and before the push; ``keysync.ledger_read:stop`` freezes it
    just after it read a ledger batch, until a SIGCONT. With ``KD_FAULT_ARMED`` (a file's
    path) the point fires only while that file exists, once (it is removed): a test
    chooses the moment. Unset (production): ``no_fault``.
    """
    target, _, action = os.environ.get(FAULT_POINT_ENV, "").partition(":")
    if not target:
        return no_fault
    armed = os.environ.get(FAULT_ARMED_ENV, "")

    def fault_at(point: str) -> None:
        if point != target or (armed and not _disarmed(armed)):
            return
        log.error("fault_point_reached", extra={"point": point, "action": action or "die"})
        if action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        os._exit(137)

    return fault_at


def _disarmed(path: str) -> bool:
    """Whether the arming file was there (and is now gone: the point fires once)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def instance_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (graceful shutdown)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep up to ``seconds``, returning early when ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


class Outage:
    """Logs a store outage once when it starts and once when it ends; backs off."""

    def __init__(self, store: str, *, first_delay_s: float = 0.2, max_delay_s: float = 5.0) -> None:
        self._store = store
        self._first = first_delay_s
        self._max = max_delay_s
        self._delay = first_delay_s
        self._down = False

    def failed(self, exc: StoreUnavailable) -> float:
        """Record a failure; returns how long to wait before retrying."""
        if not self._down:
            self._down = True
            log.error("store_unavailable", extra={"store": self._store, "error": str(exc)})
        delay = self._delay
        self._delay = min(self._delay * 2, self._max)
        return delay

    def succeeded(self) -> None:
        if self._down:
            log.info("store_recovered", extra={"store": self._store})
        self._down = False
        self._delay = self._first


async def connect_with_retry(
    connect: Callable[[], Awaitable[T]], store: str, stop: asyncio.Event
) -> T | None:
    """Retry ``connect`` with backoff until it works or ``stop`` is set (None)."""
    outage = Outage(store)
    while not stop.is_set():
        try:
            result = await connect()
        except StoreUnavailable as exc:
            await sleep_or_stop(stop, outage.failed(exc))
            continue
        outage.succeeded()
        return result
    return None


def write_secret(path: Path, text: str) -> None:
    """Create ``path`` holding ``text``, mode 0600, atomically: readers see no file or the
    whole secret, never a partial or group-readable one; the first writer wins (``keydispenser
    secret --out``, and ``up``'s permutation key)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # 0600
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
        os.close(fd)
        with contextlib.suppress(FileExistsError):  # another `up` created it first
            os.link(temporary, path)
    finally:
        os.unlink(temporary)

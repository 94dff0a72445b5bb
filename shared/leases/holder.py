"""Holding a machine-ID lease: acquire, renew in the background, know at once when it is lost.

``lease_machine_id`` (async) and ``SyncMachineLease`` (sync code: a background thread
with its own event loop) yield a ``MachineLease``. The holder trusts the lease only
until its own deadline on the monotonic clock: the time it sent the last successful
grant or renewal, plus the TTL, minus a safety margin. Redis counts the TTL from when
it received that call, so the holder always stops first. A refused or failed renewal,
a passed deadline or a new Redis identity (the fence) sets ``lost`` at once.

Timestamps (Snowflake minting): every grant and renewal records a ceiling in Redis,
the holder's wall clock plus one TTL; the holder never mints above ``ceiling_ms()``,
and the next holder of the ID mints strictly above ``floor_ms``. Details and limits:
docs/leases.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import KW_ONLY, dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.domain.config.redis import DEFAULT_NAMESPACE
from shared.domain.errors import ConfigError, NoMachineIdFree, StoreUnavailable
from shared.domain.leases import NO_WAIT, LeaseWait, check_pool, check_ttl, safety_margin_s
from shared.leases.store import Acquired, MachineLeases
from shared.stores.redis.endpoint import RedisEndpoint

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")
POOL = ["pool"]
_RETRY_S = 0.2  # longest pause between acquire attempts while waiting
_RELEASE_TIMEOUT_S = 2.0
_STOP_TIMEOUT_S = 10.0


class LeaseMetrics:
    """Machine-ID leases seen by this process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.acquisitions = Counter(
            "kd_lease_acquisitions",
            "Acquire attempts, by outcome (granted, full, settling, error)",
            [*POOL, "outcome"],
            registry=registry,
        )
        self.acquire_seconds = Histogram(
            "kd_lease_acquire_duration_seconds",
            "From the first acquire attempt to a grant or giving up",
            POOL,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60),
            registry=registry,
        )
        self.renew_failures = Counter(
            "kd_lease_renew_failures",
            "Renewals that did not extend the lease, by reason (lost, fenced, error)",
            [*POOL, "reason"],
            registry=registry,
        )
        self.held = Gauge("kd_leases_held", "Leases this process holds", POOL, registry=registry)
        self.exhausted = Counter(
            "kd_lease_pool_exhausted",
            "Acquires given up because no machine ID was free in time",
            POOL,
            registry=registry,
        )


def default_owner() -> str:
    """A readable, unique owner token: host, process, random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def wall_of(monotonic: float) -> float:
    """The wall time (unix ms) of a monotonic instant, for log lines: one clock for every
    holder on a host, so their intervals can be compared."""
    return round(time.time() * 1000 - (time.monotonic() - monotonic) * 1000, 3)


class MachineLease:
    """A machine ID held until ``lost`` is set or the holder's deadline passes."""

    def __init__(
        self, pool: str, granted: Acquired, owner: str, ttl_s: float, sent_at: float, ceiling: int
    ) -> None:
        self.pool = pool
        self.machine_id = granted.machine_id
        self.floor_ms = granted.floor_ms
        self.owner = owner
        self.fence = granted.fence
        self.ttl_s = ttl_s
        self.margin_s = safety_margin_s(ttl_s)
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._deadline = sent_at + ttl_s - self.margin_s
        self._ceiling = ceiling
        self._issued: int | None = None
        self.granted_at = time.monotonic()  # when the grant was received

    def end(self) -> None:
        """The holder is done with the ID: lost at its deadline if that passed before
        the renewer noticed, else released now."""
        self.lose("deadline" if time.monotonic() >= self._deadline else "released")

    def valid(self) -> bool:
        """Not lost, and the monotonic clock is before the holder's safe deadline."""
        return not self.lost.is_set() and time.monotonic() < self._deadline

    def ceiling_ms(self) -> int:
        """The highest timestamp recorded in Redis for this ID so far: never mint above."""
        return self._ceiling

    def note_issued(self, ms: int) -> None:
        """The latest timestamp minted; on release it replaces the recorded ceiling."""
        if self._issued is None or ms > self._issued:
            self._issued = ms

    @property
    def issued_ms(self) -> int | None:
        return self._issued

    @property
    def deadline(self) -> float:
        """The monotonic time at which the holder stops using the ID."""
        return self._deadline

    def extended(self, sent_at: float, ceiling: int) -> None:
        self._deadline = sent_at + self.ttl_s - self.margin_s
        self._ceiling = max(self._ceiling, ceiling)

    def lose(self, reason: str) -> None:
        if not self.lost.is_set():
            deadline, stopped = self._deadline, time.monotonic()
            self.lost_reason = reason
            self._deadline = 0.0
            self.lost.set()
            # The end of this holder's use of the ID: its deadline, or now if earlier.
            log.info(
                "lease_stopped",
                extra=self.fields()
                | {"reason": reason, "stopped_at": wall_of(min(deadline, stopped))},
            )

    def fields(self) -> dict[str, Any]:
        """Who holds what, for log lines."""
        return {"pool": self.pool, "machine_id": self.machine_id, "owner": self.owner}


@dataclass(frozen=True)
class LeaseRequest:
    """A machine ID of ``[lo, hi]`` in ``pool`` and the terms it is held on: the
    arguments of ``lease_machine_id`` and of ``SyncMachineLease``, written once.

    ``renew_every_s`` at most a third of ``ttl_s``; ``wait_s``: how long to try for a
    grant; ``owner``: a readable label (default: host and process), a random suffix
    makes the owner token unique; ``metrics``: where the lease metrics are counted;
    ``namespace``: the deployment's ``redis_namespace`` (its pool's key group);
    ``wait``: how many Redis replicas must acknowledge a grant or renewal for it to
    count (LeaseWait).
    """

    endpoint: RedisEndpoint
    pool: str
    lo: int
    hi: int
    _: KW_ONLY
    ttl_s: float = 10.0
    renew_every_s: float = 1.0
    wait_s: float = 0.0
    owner: str | None = None
    metrics: LeaseMetrics | None = None
    namespace: str = DEFAULT_NAMESPACE
    wait: LeaseWait = NO_WAIT


def _called_with(
    request: Callable[P, LeaseRequest],
) -> Callable[[Callable[[LeaseRequest], T]], Callable[P, T]]:
    """A function of a request, called with the request's arguments (its signature)."""

    def decorate(use: Callable[[LeaseRequest], T]) -> Callable[P, T]:
        @functools.wraps(use)
        def called(*args: P.args, **kwargs: P.kwargs) -> T:
            return use(request(*args, **kwargs))

        called.__signature__ = inspect.signature(request).replace(  # type: ignore[attr-defined]
            return_annotation=inspect.signature(use).return_annotation
        )
        return called

    return decorate


def _constructed_with(
    request: Callable[P, LeaseRequest],
) -> Callable[[Callable[[S, LeaseRequest], None]], Callable[Concatenate[S, P], None]]:
    """An ``__init__`` of a request, called with the request's arguments."""

    def decorate(init: Callable[[S, LeaseRequest], None]) -> Callable[Concatenate[S, P], None]:
        @functools.wraps(init)
        def __init__(self: S, /, *args: P.args, **kwargs: P.kwargs) -> None:
            init(self, request(*args, **kwargs))

        shown = inspect.signature(request)
        this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        __init__.__signature__ = shown.replace(  # type: ignore[attr-defined]
            parameters=[this, *shown.parameters.values()], return_annotation=None
        )
        return __init__

    return decorate


async def acquire(store: MachineLeases, request: LeaseRequest, owner: str) -> MachineLease:
    """Attempt until a grant or ``wait_s`` has passed; raises NoMachineIdFree, or
    StoreUnavailable when Redis could not be reached by then."""
    pool, lo, hi, ttl_s = request.pool, request.lo, request.hi, request.ttl_s
    wait_s, metrics = request.wait_s, request.metrics
    started = time.monotonic()
    give_up = started + wait_s
    while True:
        sent_at = time.monotonic()
        ceiling = _wall_ms() + int(ttl_s * 1000)
        try:
            answer = await store.acquire(
                pool, lo, hi, owner, int(ttl_s * 1000), ceiling, secrets.randbelow(hi - lo + 1)
            )
        except StoreUnavailable:
            _count(metrics, pool, "error")
            if time.monotonic() >= give_up:
                raise
            await asyncio.sleep(min(give_up - time.monotonic(), _RETRY_S))
            continue  # Redis may be failing over: ride it out within the wait
        _count(metrics, pool, answer.status)
        if answer.granted:
            _observe(metrics, pool, started)
            return MachineLease(pool, answer, owner, ttl_s, sent_at, ceiling)
        remaining = give_up - time.monotonic()
        if remaining <= 0:
            _observe(metrics, pool, started)
            if metrics is not None:
                metrics.exhausted.labels(pool).inc()
            settling = answer.wait_ms / 1000 if answer.status == "settling" else None
            raise NoMachineIdFree(pool, lo, hi, _why(answer, wait_s), settling)
        await asyncio.sleep(min(remaining, _RETRY_S, max(answer.wait_ms / 1000, 0.01)))


def _why(answer: Acquired, wait_s: float) -> str:
    waited = f" (waited {wait_s:g}s)" if wait_s else ""
    if answer.status == "unreplicated":
        return (
            "no Redis replica acknowledged the grant in time (lease_wait_replicas): the "
            f"primary may be cut off from its replicas{waited}"
        )
    if answer.status == "settling":
        return (
            "the Redis fence took over recently (failover, failback, restart or first use): "
            f"no ID is granted for one lease TTL; grants resume in "
            f"{answer.wait_ms / 1000:.1f}s{waited}"
        )
    return f"every ID is held; the first lease expires in {answer.wait_ms / 1000:.1f}s{waited}"


def _count(metrics: LeaseMetrics | None, pool: str, outcome: str) -> None:
    if metrics is not None:
        metrics.acquisitions.labels(pool, outcome).inc()


def _observe(metrics: LeaseMetrics | None, pool: str, started: float) -> None:
    if metrics is not None:
        metrics.acquire_seconds.labels(pool).observe(time.monotonic() - started)


async def keep_renewed(
    store: MachineLeases,
    lease: MachineLease,
    renew_every_s: float,
    metrics: LeaseMetrics | None = None,
) -> None:
    """Renew every ``renew_every_s`` until the lease is lost; each attempt is bounded by
    the holder's deadline, so a hung Redis call cannot keep a lost lease in use."""
    while not lease.lost.is_set():
        await _sleep_until(lease, time.monotonic() + renew_every_s)
        if lease.lost.is_set():
            return
        if time.monotonic() >= lease.deadline:
            _lost(lease, "deadline", metrics)
            return
        await _renew_once(store, lease, metrics)


async def _sleep_until(lease: MachineLease, when: float) -> None:
    """Until ``when`` or the lease's deadline, whichever comes first, or until lost."""
    pause = min(when, lease.deadline) - time.monotonic()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(lease.lost.wait(), timeout=max(pause, 0))


async def _renew_once(
    store: MachineLeases, lease: MachineLease, metrics: LeaseMetrics | None
) -> None:
    sent_at = time.monotonic()
    ceiling = _wall_ms() + int(lease.ttl_s * 1000)
    call = store.renew(
        lease.pool, lease.machine_id, lease.owner, lease.fence, int(lease.ttl_s * 1000), ceiling
    )
    try:
        status = await asyncio.wait_for(call, timeout=max(lease.deadline - sent_at, 0.001))
    except (StoreUnavailable, TimeoutError) as exc:
        if metrics is not None:
            metrics.renew_failures.labels(lease.pool, "error").inc()
        log.warning("lease_renew_failed", extra={"pool": lease.pool, "error": str(exc)})
        return  # tried again at the next beat, while the deadline allows
    if status == "unreplicated":
        # Not counted: a primary no replica acknowledges may be a cut-off old one. The
        # deadline stays; the holder stops at it unless a later renewal counts.
        if metrics is not None:
            metrics.renew_failures.labels(lease.pool, status).inc()
        log.warning("lease_renew_unreplicated", extra=lease.fields())
        return
    if status == "renewed":
        # Logged first: a holder killed right after still has its deadline on record.
        deadline = sent_at + lease.ttl_s - lease.margin_s
        # DEBUG: one line per renewal per holder (every second by default). The drill,
        # and an operator auditing who held an ID when, set log_levels for this logger.
        log.debug("lease_renewed", extra=lease.fields() | {"deadline_at": wall_of(deadline)})
        lease.extended(sent_at, ceiling)
    else:
        _lost(lease, status, metrics)


def _lost(lease: MachineLease, reason: str, metrics: LeaseMetrics | None) -> None:
    if metrics is not None and reason != "deadline":
        metrics.renew_failures.labels(lease.pool, reason).inc()
    log.error(
        "lease_lost",
        extra={"pool": lease.pool, "machine_id": lease.machine_id, "reason": reason},
    )
    lease.lose(reason)


async def release(store: MachineLeases, lease: MachineLease) -> None:
    """Compare-and-delete; failures are logged (the lease then expires by its TTL)."""
    lease.end()
    try:
        async with asyncio.timeout(_RELEASE_TIMEOUT_S):  # not wait_for: it can lose a cancel
            released = await store.release(
                lease.pool, lease.machine_id, lease.owner, lease.issued_ms
            )
    except (StoreUnavailable, TimeoutError) as exc:
        log.warning("lease_release_failed", extra={"pool": lease.pool, "error": str(exc)})
        return
    log.info(
        "lease_released",
        extra={"pool": lease.pool, "machine_id": lease.machine_id, "was_owner": released},
    )


def check_named(endpoint: RedisEndpoint) -> None:
    """Refuse an endpoint that names no Redis: a machine ID is unique only among the
    holders of one Redis, and whatever answers at 127.0.0.1:6379 (a developer's server,
    a sidecar) would grant IDs the deployment's holders also hold."""
    if not endpoint.named:
        raise ConfigError(
            "lease_machine_id: the endpoint names no Redis; pass the deployment's "
            "(RedisEndpoint(url), or RedisEndpoint.from_settings(settings))"
        )


@_called_with(LeaseRequest)
def lease_machine_id(request: LeaseRequest) -> AbstractAsyncContextManager[MachineLease]:
    """Hold a machine ID of ``[lo, hi]`` in ``pool`` for the body; released on exit.

    ``lease_machine_id(endpoint, pool, lo, hi, *, ttl_s=10.0, renew_every_s=1.0,
    wait_s=0.0, owner=None, metrics=None, namespace="kd", wait=NO_WAIT)``: the
    arguments of ``LeaseRequest``, which says what each means. Raises NoMachineIdFree
    when none is granted within ``wait_s``, ConfigError for a bad pool name or range,
    when ``renew_every_s`` exceeds a third of ``ttl_s``, or for an endpoint that names
    no Redis (``check_named``). The endpoint stays open (it belongs to the caller).
    """
    return held(request)


@asynccontextmanager
async def held(request: LeaseRequest) -> AsyncIterator[MachineLease]:
    """The machine ID ``request`` asks for, held for the body (``lease_machine_id``)."""
    pool, metrics = request.pool, request.metrics
    check_pool(pool, request.lo, request.hi)
    check_ttl(request.ttl_s, request.renew_every_s)
    check_named(request.endpoint)
    store = MachineLeases(request.endpoint, request.namespace, request.wait)
    token = f"{request.owner or default_owner()}#{secrets.token_hex(6)}"
    lease = await acquire(store, request, token)
    log.info(
        "lease_granted",
        extra=lease.fields()
        | {"granted_at": wall_of(lease.granted_at), "deadline_at": wall_of(lease.deadline)},
    )
    if metrics is not None:
        metrics.held.labels(pool).inc()
    renewer = asyncio.create_task(keep_renewed(store, lease, request.renew_every_s, metrics))
    try:
        yield lease
    finally:
        # The lease's own flag stops the renewer too: a cancellation can be lost (before
        # Python 3.12, asyncio.wait_for returns its call's result when the call finishes
        # as the cancellation lands), and a renewer that kept renewing would hold this
        # exit forever. Waiting with asyncio.wait passes on a cancellation of the caller.
        lease.end()
        renewer.cancel()
        try:
            await asyncio.wait([renewer])
        finally:
            try:
                await release(store, lease)
            finally:
                if metrics is not None:
                    metrics.held.labels(pool).dec()
        if not renewer.cancelled():
            renewer.result()  # a renewer that failed raises here, as it did


class SyncMachineLease:
    """``lease_machine_id`` for sync code: renews in a background thread with its own
    event loop. ``with SyncMachineLease(endpoint, "orders", 0, 1023) as lease: ...``;
    ``lease.lost`` is a ``threading.Event``. Stop minting before leaving the block.
    The endpoint is used from the background thread only, and closed there on exit."""

    @_constructed_with(LeaseRequest)
    def __init__(self, request: LeaseRequest) -> None:
        check_named(request.endpoint)  # in the caller's thread: the error reaches it at once
        self._request = request
        self.lost = threading.Event()
        self._lease: MachineLease | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def lease(self) -> MachineLease:
        assert self._lease is not None, "use SyncMachineLease in a with block"
        return self._lease

    @property
    def pool(self) -> str:
        return self.lease.pool

    @property
    def machine_id(self) -> int:
        return self.lease.machine_id

    @property
    def floor_ms(self) -> int:
        return self.lease.floor_ms

    def valid(self) -> bool:
        return self.lease.valid()

    def ceiling_ms(self) -> int:
        return self.lease.ceiling_ms()

    def note_issued(self, ms: int) -> None:
        self.lease.note_issued(ms)

    def __enter__(self) -> SyncMachineLease:
        granted: Future[MachineLease] = Future()
        self._thread = threading.Thread(target=self._run, args=(granted,), daemon=True)
        self._thread.start()
        self._lease = granted.result()  # raises NoMachineIdFree, StoreUnavailable, ...
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(_STOP_TIMEOUT_S)

    def _run(self, granted: Future[MachineLease]) -> None:
        asyncio.run(self._hold(granted))

    async def _hold(self, granted: Future[MachineLease]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with held(self._request) as lease:
                granted.set_result(lease)
                lost = asyncio.create_task(lease.lost.wait())
                await asyncio.wait(
                    [lost, asyncio.create_task(self._stop.wait())],
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if lost.done():
                    self.lost.set()
                    await self._stop.wait()
        except BaseException as exc:
            if not granted.done():
                granted.set_exception(exc)
            else:
                raise
        finally:
            self.lost.set()
            await self._request.endpoint.close()

"""The app the servers run, wired: the stores' adapters, the service, the API-key gate,
"one ID" (``dispenser.single``) carried before Starlette's stack by
``dispenser.fastpath.FastPath``, and the other routes (``dispenser.routes``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from dispenser import openg2p, routes, single
from dispenser.auth import Gate
from dispenser.clock_hook import arm as arm_clock_hook
from dispenser.clock_hook import clock_from_environment
from dispenser.fastpath import FastPath, Serving
from dispenser.metrics import DispenserMetrics, Timing
from dispenser.openapi import document
from dispenser.service import Dispenser, Stores
from dispenser.single import SingleId
from dispenser.snowflake import Snowflakes, redis_leases
from dispenser.worker_metrics import WorkerMetrics
from shared.domain.config import Settings, path_segments
from shared.domain.errors import KeydispenserError
from shared.domain.leases import lease_wait
from shared.domain.snowflake import Clock, build_snowflake_types
from shared.leases.holder import LeaseMetrics
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.groups import Groups, SyncRecords, dispenser_ports
from shared.stores.ledger.reader import LedgerReader

log = logging.getLogger(__name__)

# How long start-up waits for the first machine-ID lease of each snowflake type (requests
# are answered 503 IDG-016 until it is held).
FIRST_LEASE_WAIT_S = 2.0


def create_app(settings: Settings, clock: Clock | None = None) -> FastPath:
    """The dispenser's app (ASGI and RSGI at once). ``clock`` is the minters' clock (ms;
    default: the wall clock, or the drill's test hook when its variable is set)."""
    minting_clock = clock or clock_from_environment(os.environ)
    metrics = DispenserMetrics(CollectorRegistry())
    lease_metrics = LeaseMetrics(metrics.registry)
    # What the fast path answers "one ID" with: set below once the service is up.
    serving = Serving()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Every key group (one, unless a cluster holds each type in its own slot).
        groups = Groups(settings)
        router, wake, stream = dispenser_ports(groups)
        records = SyncRecords(groups.each(SyncRecord), groups.types)
        source = redis_leases(groups.place, lease_metrics, lease_wait(settings))
        snowflakes = Snowflakes(build_snowflake_types(settings), source, metrics, minting_clock)
        arm_clock_hook(minting_clock)
        stores = Stores(
            hot=router,
            # The wake lists and the ledger streams share the hot stores' connections.
            wake=wake,
            ledger_stream=stream,
            # Ledger reads are judged against each group's fence record (the guard off,
            # a drill's control: not judged).
            ledger=LedgerReader(
                settings.postgres_dsn,
                records if settings.postgres_fence else None,
                settings.postgres_pooler,
            ),
        )
        app.state.dispenser = dispenser = Dispenser(settings, stores, metrics, snowflakes)
        app.state.gate = gate = Gate(settings.dispenser.auth, path_segments(settings.id_types))
        app.state.single = answers = SingleId(
            dispenser.by_segment(), gate, metrics, dispenser.source
        )
        await gate.start()  # the identity providers' keys, when OIDC is on
        await snowflakes.start(FIRST_LEASE_WAIT_S)
        app.state.openapi = document(settings, metadata.version("keydispenser"))
        app.state.build = openg2p.build_info(os.environ)
        # One of several worker processes: /metrics answers for all of them.
        app.state.worker_metrics = workers = WorkerMetrics.from_environment(metrics.registry)
        snapshots = asyncio.ensure_future(workers.keep_writing()) if workers else None
        dispenser.announce_exposure()
        serving.serve(answers)
        gc.freeze()  # start-up objects never become garbage: keep them out of collections
        log.info("dispenser_started", extra={"pid": os.getpid()})
        try:
            yield
        finally:
            if snapshots is not None:
                snapshots.cancel()
                await asyncio.gather(snapshots, return_exceptions=True)
            serving.serve(None)
            await gate.close()
            await dispenser.close()
            await router.close()  # its lines, then endpoints
            await groups.close()
            log.info("dispenser_stopped", extra={"pid": os.getpid()})

    app = Starlette(
        routes=routes.ROUTES,
        lifespan=lifespan,
        middleware=[
            Middleware(routes.Guard),
            Middleware(Timing, metrics=metrics, self_timed=frozenset({single.ALLOCATE_ONE})),
        ],
        exception_handlers={
            KeydispenserError: routes.on_domain_error,
            HTTPException: routes.on_http_error,
        },
    )
    return FastPath(app, serving)

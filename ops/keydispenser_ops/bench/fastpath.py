"""``keydispenser bench fastpath``: the dispenser's own CPU per single-ID request.

The single-ID route (``dispenser.fastpath`` over RSGI, as granian calls it) is called
in this process by CALLERS concurrent callers against the Redis at ``redis_url``, with
no HTTP server and no network in between: what is measured is the dispenser's own
Python (routing, the pool and its coalesced pops, the fenced pop, the envelope, the metrics) and the
Redis client, on uvloop as the servers run it. HTTP figures on a small machine shared
by the load generator, the server and Redis move by a third from run to run; this one
moves by about a tenth, so it is the one to compare two builds with (alternating them).

Results: ``requests`` answered in ``--seconds`` after a warm-up, ``cpu_us_per_request``
(this process's CPU time, Redis's not included), ``wall_us_per_request``,
``keys_per_pop`` (keys one coalesced Redis call took: for the requests waiting and
for the type's prefetch stock) and ``non_200`` (answers other than 200: must be 0, or
the figures are not the single-ID route's). The same measure is then made with every
request carrying an OIDC bearer token (an identity provider on loopback, ``tokens``):
the ``token_`` fields, and ``token_cost_us`` (CPU per request over the one without).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, cast

import redis.asyncio as aioredis
import uvloop
from prometheus_client import CollectorRegistry

from dispenser.app import create_app
from dispenser.fastpath import FastPath
from dispenser.rsgi import HTTPProtocol
from dispenser.rsgi import Scope as RsgiScope
from keydispenser_ops.bench import Options, dispense
from keydispenser_ops.bench.tokens import LocalIssuer
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import ConfigError

NAME = dispense.DISPENSE_TYPE  # the type, its keys and its hot list: the dispense bench's
CALLERS = 32  # as the HTTP benches' connections
WARM_UP = 2_000  # requests before the measure starts
# Keys filled per second measured: well over what one process answers in-process.
KEYS_PER_S = 150_000
MAX_SECONDS = 60  # the keys filled (150,000 per second) stay a few hundred MB of Redis


@dataclass
class _Request:
    """The RSGI scope of ``POST /v1/idgenerator/{type}/id`` (the attributes read)."""

    path: str
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)


class _Answers:
    """An RSGI protocol that only counts the answers."""

    def __init__(self) -> None:
        self.ok = 0
        self.other = 0

    def response_bytes(self, status: int, headers: Any, body: bytes) -> None:
        if status == 200:
            self.ok += 1
        else:
            self.other += 1


def _pops(registry: CollectorRegistry) -> tuple[float, float]:
    """Coalesced pops made so far, and the keys they asked for (kd_pop_requests)."""
    count = registry.get_sample_value("kd_pop_requests_count") or 0.0
    return count, registry.get_sample_value("kd_pop_requests_sum") or 0.0


async def _measure(
    app: FastPath, seconds: float, budget: int, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    starlette = app.app
    answers = _Answers()
    scope = cast(RsgiScope, _Request(f"/v1/idgenerator/{NAME}/id", headers=headers or {}))
    protocol = cast(HTTPProtocol, answers)

    async def one() -> None:
        await app.__rsgi__(scope, protocol)

    async with starlette.router.lifespan_context(starlette):
        for _ in range(WARM_UP // CALLERS):
            await asyncio.gather(*(one() for _ in range(CALLERS)))
        registry = starlette.state.dispenser.metrics.registry
        pops_before, keys_before = _pops(registry)
        ok_before, other_before = answers.ok, answers.other
        per_caller = max(1, (budget - WARM_UP) // CALLERS)
        deadline = time.monotonic() + seconds

        async def caller() -> None:
            for _ in range(per_caller):  # bounded in count and in time
                if time.monotonic() >= deadline:
                    return
                await one()

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(CALLERS)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        requests = answers.ok + answers.other - ok_before - other_before
        pops, keys = _pops(registry)
        pops, keys = pops - pops_before, keys - keys_before
    return {
        "requests": requests,
        "seconds": round(wall, 3),
        "cpu_us_per_request": round(cpu / max(requests, 1) * 1e6, 2),
        "wall_us_per_request": round(wall / max(requests, 1) * 1e6, 2),
        "keys_per_pop": round(keys / max(pops, 1), 2),
        "non_200": answers.other - other_before,
        "callers": CALLERS,
    }


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    if not 1 <= seconds <= MAX_SECONDS:
        raise ConfigError(f"bench fastpath --seconds: from 1 to {MAX_SECONDS}")
    if settings.redis_sentinel is not None:
        raise ConfigError("redis_sentinel: bench fastpath needs redis_url (a scratch database)")
    values = settings.model_dump()
    # The bench type only, and none of the configured API keys (each call would be 401).
    values |= {"log_level": "WARNING", "id_types": {NAME: dispense.DISPENSE_TYPE_CONFIG}}
    values["dispenser"] = values["dispenser"] | {"auth": {}}
    bench_settings = Settings.model_validate(values)
    client = aioredis.from_url(settings.redis_url)
    try:
        budget = WARM_UP + round(seconds * KEYS_PER_S)
        await dispense.fill(settings, client, budget)
        app = create_app(bench_settings)
        # Its own uvloop, as the servers run the app on; this thread's loop only waits.
        result = await asyncio.to_thread(uvloop.run, _measure(app, seconds, budget))
        with LocalIssuer() as issuer:
            auth = {"oidc": issuer.oidc()}
            values["dispenser"] = values["dispenser"] | {"auth": auth}
            token_app = create_app(Settings.model_validate(values))
            headers = {"authorization": f"Bearer {issuer.token()}"}
            await dispense.fill(settings, client, budget)
            tokens = await asyncio.to_thread(
                uvloop.run, _measure(token_app, seconds, budget, headers)
            )
        result |= {f"token_{name}": value for name, value in tokens.items() if name != "callers"}
        result["token_cost_us"] = round(
            tokens["cpu_us_per_request"] - result["cpu_us_per_request"], 2
        )
    finally:
        hot_list = redis_keys.hot_list_key(settings.redis_namespace, NAME)
        await client.delete(hot_list)
        await client.srem(redis_keys.hot_registry_key(settings.redis_namespace), hot_list)
        await client.aclose()
    return {"bench": "fastpath", **result}

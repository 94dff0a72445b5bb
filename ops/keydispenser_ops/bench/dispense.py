"""``keydispenser bench dispense``: the dispenser against the HTTP ceiling and PostgreSQL.

One run, one machine, one load generator, 32 connections, a bounded duration each:
  a. bare apps returning a constant JSON body, the HTTP ceilings: a Starlette endpoint,
     and the server alone (a pure ASGI app on uvicorn, a pure RSGI app on granian);
  b. ``POST /v1/idgenerator/{type}/id`` (one key per request);
  c. ``POST /v1/keys/{type}?count=1000`` (keys/s), for at most ``BATCH_SECONDS``;
  d. IDs issued from PostgreSQL per request (``SELECT ... FOR UPDATE SKIP LOCKED`` +
     ``UPDATE``, as the reference OpenG2P service does).
All are served by uvicorn, first with one worker, then with one worker per core;
a. and b. are also served by granian (``granian_*`` fields), in the same run. The
dispenser is judged against its own server's ceiling: ``single_vs_bare_asgi`` on
uvicorn, ``granian_single_vs_bare_rsgi`` on granian (the dispenser runs granian over
RSGI).
The load generator is ``wrk`` when installed, else a bundled asyncio client (which
saturates before the servers do: its figures are lower bounds).

Uses the configured ``redis_url`` and ``postgres_dsn``: point them at scratch
databases (the bench fills a hot list there, and a table in PostgreSQL, then drops both).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import redis.asyncio as aioredis
import yaml

from keydispenser_ops.bench import BENCH_PERMUTATION_KEY, Options
from keydispenser_ops.bench import servers as bench_servers
from keydispenser_ops.bench.tokens import LocalIssuer
from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import (
    cli_command,
    listening,
    scrubbed_env,
    serving,
    spawn,
    stop_process,
)
from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.errors import ConfigError, KeydispenserError
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres.databases import ensure_database
from shared.stores.redis.endpoint import RedisEndpoint

# The one ID type this bench dispenses (from a hot list it fills itself).
DISPENSE_TYPE = "kd_bench"
DISPENSE_TYPE_CONFIG: dict[str, Any] = {
    "kind": "numeric",
    "length": 10,
    "hot": {"low": 0, "high": 1},
}
CONNECTIONS = 32
BATCH = 1_000
# c. batch hands out millions of keys a second, all filled into Redis beforehand (about
# 12 bytes each): it runs at most this long, with this many keys per second of it.
BATCH_SECONDS = 3.0
BATCH_KEYS_PER_S = 6_000_000
TARGETS = {
    "single_vs_bare": 0.75,
    "single_vs_pg_baseline": 15.0,
    "batch_keys_per_s": 500_000,
    "ledger_async": 0.85,  # a ledger type's single-ID route against a plain type's
    "single_p99_ms": 5.0,
    "granian_single_vs_uvicorn_bare": 1.3,
    "granian_single_p99_ms": 5.0,
    # Against granian's own ceiling: throughput, and p99 as a multiple of the bare app's.
    "granian_single_vs_bare_rsgi": 0.75,
    "granian_single_p99_vs_bare_rsgi": 1.5,
}
SERVERS = ("uvicorn", "granian")
# Reported for each server at the top level (from the one-worker run).
HEADLINE = ("bare_rps", "bare_p99_ms", "single_rps", "single_p99_ms")
# Server-side generation of synthetic keys (the dispenser does not look inside them).
FILL_SCRIPT = """
local from, to = tonumber(ARGV[1]), tonumber(ARGV[2])
local chunk = {}
for i = from, to do
  chunk[#chunk + 1] = string.format('%010d', i)
  if #chunk == 5000 then redis.call('RPUSH', KEYS[1], unpack(chunk)); chunk = {} end
end
if #chunk > 0 then redis.call('RPUSH', KEYS[1], unpack(chunk)) end
redis.call('SADD', KEYS[2], KEYS[1])
return redis.call('LLEN', KEYS[1])
"""


log = logging.getLogger(__name__)


class LoadGenerator:
    """wrk when present, else the bundled client; same connections and duration."""

    def __init__(self, seconds: float, choice: str = "auto", rounds: int = 1) -> None:
        self.seconds = seconds
        self.rounds = rounds  # each measure made this many times, the best kept
        self.wrk = shutil.which("wrk") if choice != "bundled" else None
        # How long each run lasts: wrk takes whole seconds, at least one.
        self.duration = float(max(1, round(seconds))) if self.wrk else seconds
        if choice == "wrk" and self.wrk is None:
            raise ConfigError("bench --load wrk: wrk is not installed (apt-get install wrk)")
        self.name = "wrk" if self.wrk else "bundled-asyncio-client"
        # Said out loud at the first run (not before: a bench that cannot reach its
        # servers fails in one line): the bundled client saturates a core of its own and
        # measures a lower ceiling than wrk; the report's load_generator names it too.
        self._warn_fallback = choice == "auto" and self.wrk is None

    def announce(self) -> None:
        """Say once that the bundled client stands in for wrk."""
        if self._warn_fallback:
            self._warn_fallback = False
            log.warning(
                "bench_load_generator_fallback",
                extra={"load_generator": self.name, "hint": "apt-get install wrk"},
            )

    async def run(self, url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
        """The best of ``rounds`` measures (by requests/s) of ``url``."""
        self.announce()
        best: dict[str, float] | None = None
        for _ in range(self.rounds):
            if self.wrk:
                result = await asyncio.to_thread(self._wrk, url, headers or {})
            else:
                result = await self._bundled(url, headers or {})
            if best is None or result["rps"] > best["rps"]:
                best = result
        assert best is not None
        return best

    def _wrk(self, url: str, headers: dict[str, str]) -> dict[str, float]:
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
            script.write('wrk.method = "POST"\n')
            for name, value in headers.items():
                script.write(f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}\n")
        try:
            out = subprocess.run(
                [
                    str(self.wrk),
                    "-t1",
                    f"-c{CONNECTIONS}",
                    f"-d{round(self.duration)}s",
                    "--latency",
                    "--timeout",
                    "5s",
                    "-s",
                    script.name,
                    url,
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=self.seconds + 60,
            ).stdout
        finally:
            os.unlink(script.name)
        return parse_wrk(out)

    async def _bundled(self, url: str, headers: dict[str, str]) -> dict[str, float]:
        latencies: list[float] = []
        errors = 0
        deadline = time.perf_counter() + self.seconds
        connector = aiohttp.TCPConnector(limit=CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def worker() -> None:
                nonlocal errors
                while time.perf_counter() < deadline:
                    started = time.perf_counter()
                    async with session.post(url, headers=headers) as reply:
                        await reply.read()
                        errors += reply.status >= 300
                    latencies.append(time.perf_counter() - started)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))
            elapsed = time.perf_counter() - started
        latencies.sort()
        return {
            "rps": len(latencies) / elapsed,
            "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
            "requests": len(latencies),
            "non_2xx": errors,
        }


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_wrk(out: str) -> dict[str, float]:
    """Requests/s, p50/p99 latency (ms), request and non-2xx counts from wrk --latency."""

    def latency(percentile: str) -> float:
        found = re.search(rf"^\s+{percentile}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if found is None:
            raise ValueError(f"wrk printed no {percentile}% latency:\n{out}")
        return float(found.group(1)) * _UNITS[found.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    if rps is None or total is None:
        raise ValueError(f"unexpected wrk output:\n{out}")
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {
        "rps": float(rps.group(1)),
        "p50_ms": latency("50"),
        "p99_ms": latency("99"),
        "requests": float(total.group(1)),
        "non_2xx": float(non_2xx.group(1)) if non_2xx else 0.0,
    }


async def fill(settings: Settings, client: aioredis.Redis, count: int) -> int:
    """The bench type's hot list, refilled with ``count`` keys; its length after."""
    hot = redis_keys.hot_list_key(settings.redis_namespace, DISPENSE_TYPE)
    await client.delete(hot)
    # The fence takes ownership first: on a server it has not seen, it would
    # discard every registered hot list, the one filled here included.
    store = HotStore(RedisEndpoint(settings.redis_url), settings.redis_namespace)
    try:
        await store.observe(DISPENSE_TYPE)
    finally:
        await store.close()
    step = 500_000
    for start in range(0, count, step):
        await client.eval(
            FILL_SCRIPT,
            2,
            hot,
            redis_keys.hot_registry_key(settings.redis_namespace),
            start,
            min(start + step, count) - 1,
        )
    return int(await client.llen(hot))


class BenchServer:
    """One HTTP server in a child process, stopped on exit."""

    def __init__(
        self, argv: list[str], env: dict[str, str], port: int, ready_path: str | None = None
    ) -> None:
        """``ready_path``: a GET route that answers 200 once the app has started."""
        self.argv, self.env, self.port, self.ready_path = argv, env, port, ready_path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BenchServer:
        # stdout is the bench's own report: the servers may only use stderr.
        self.process = spawn(self.argv, self.env, "stderr_only")
        if not listening(self.port, 30, self.process):
            self.__exit__()
            raise KeydispenserError(f"bench server did not start: {' '.join(self.argv)}")
        url = f"http://127.0.0.1:{self.port}{self.ready_path}"
        if self.ready_path and not serving(url, 30):
            self.__exit__()
            raise KeydispenserError(f"bench server did not serve {url}")
        time.sleep(0.5)  # every worker up
        return self

    def __exit__(self, *exc: object) -> None:
        stop_process(self.process)


def uvicorn_argv(factory: str, port: int, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        factory,
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--no-access-log",
        "--log-level",
        "warning",
        "--lifespan",
        "on",
    ]


def _granian(factory: str, port: int, workers: int, interface: str = "asgi") -> list[str]:
    """granian serving ``factory`` as the dispenser's granian runs (dispenser/server.py)."""
    return [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        interface,
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--loop",
        "uvloop",
        "--http",
        "1",
        "--no-ws",
        "--no-access-log",
        "--log-level",
        "warning",
        factory,
    ]


# Each bare app: its server's command line (uvicorn or granian) and its factory.
_BARE: dict[str, tuple[Any, str]] = {
    "uvicorn": (uvicorn_argv, "keydispenser_ops.bench.servers:bare"),
    "uvicorn_asgi": (uvicorn_argv, "keydispenser_ops.bench.servers:bare_asgi"),
    "granian": (_granian, "keydispenser_ops.bench.servers:bare"),
    "granian_rsgi": (
        lambda f, p, w: _granian(f, p, w, "rsgi"),
        "keydispenser_ops.bench.servers:bare_rsgi",
    ),
}


class Bench:
    def __init__(
        self,
        settings: Settings,
        seconds: float,
        work: Path,
        load: str,
        servers: tuple[str, ...] = SERVERS,
        rounds: int = 1,
    ) -> None:
        self.settings = settings
        self.with_granian = "granian" in servers
        self.seconds = seconds
        self.load = LoadGenerator(seconds, load, rounds)
        self.load_choice = load
        # c. for at most BATCH_SECONDS: its keys must all be in Redis before it starts.
        self.batch_seconds = min(seconds, BATCH_SECONDS)
        self.batch_load = LoadGenerator(self.batch_seconds, load)
        self.config = work / "bench.yaml"
        config = {
            "postgres_dsn": settings.postgres_dsn,
            "redis_url": settings.redis_url,
            "redis_namespace": settings.redis_namespace,  # the hot list fill() fills
            "log_level": "WARNING",
            "id_types": {DISPENSE_TYPE: DISPENSE_TYPE_CONFIG},
        }
        self.config.write_text(yaml.safe_dump(config))
        # The single-ID route with an OIDC token per request (the issuer serves its keys
        # from this process while the bench runs).
        self.issuer = LocalIssuer()
        self.token_config = work / "bench-token.yaml"
        token_auth = {"dispenser": {"auth": {"oidc": self.issuer.oidc()}}}
        self.token_config.write_text(yaml.safe_dump(config | token_auth))
        if settings.redis_sentinel is not None:
            raise ConfigError("redis_sentinel: bench dispense needs redis_url (a scratch database)")

    def _env(self, **extra: str) -> dict[str, str]:
        return scrubbed_env(
            KD_CONFIG=str(self.config), KD_PERMUTATION_KEY=BENCH_PERMUTATION_KEY, **extra
        )

    async def fill(self, client: aioredis.Redis, count: int) -> int:
        return await fill(self.settings, client, count)

    async def dispenser(
        self,
        client: aioredis.Redis,
        workers: int,
        path: str,
        keys: int,
        server: str = "uvicorn",
        load: LoadGenerator | None = None,
        token: str | None = None,
    ) -> Any:
        """A dispenser under load; with ``token``, configured for OIDC tokens of the
        bench's issuer and every request carrying it."""
        before = await self.fill(client, keys)
        port = free_port()
        env = self._env(
            KD_DISPENSER__PORT=str(port),
            KD_DISPENSER__WORKERS=str(workers),
            KD_DISPENSER__SERVER=server,
        )
        headers = {}
        if token is not None:
            env["KD_CONFIG"] = str(self.token_config)
            headers = {"Authorization": f"Bearer {token}"}
        with BenchServer(cli_command("dispenser"), env, port, ready_path="/healthz"):
            url = f"http://127.0.0.1:{port}{path}"
            result = await (load or self.load).run(url, headers)
        after = int(
            await client.llen(redis_keys.hot_list_key(self.settings.redis_namespace, DISPENSE_TYPE))
        )
        result["keys_served"] = before - after
        result["pool_ran_dry"] = after == 0
        return result

    async def run(self) -> dict[str, Any]:
        cores = os.cpu_count() or 1
        client = aioredis.Redis.from_url(self.settings.redis_url, decode_responses=True)
        runs: dict[str, Any] = {}
        try:
            self.issuer.__enter__()
            await self._prepare_baseline()
            for workers in sorted({1, cores}):
                runs[f"workers_{workers}"] = await self._round(client, workers)
            from keydispenser_ops.bench import ledger_dispense  # it builds on this module

            ledger = await ledger_dispense.measure(self.settings, self.seconds, self.load_choice)
        finally:
            await client.delete(
                redis_keys.hot_list_key(self.settings.redis_namespace, DISPENSE_TYPE)
            )
            await client.aclose()
            await self._drop_baseline()
            self.issuer.__exit__(None, None, None)
        report = self._report(runs, cores)
        report["ledger_durability"] = ledger | {"target_async_vs_plain": TARGETS["ledger_async"]}
        return report

    async def bare(self, app: str, workers: int) -> dict[str, float]:
        """One of the bare apps (a key of _BARE) under load."""
        port = free_port()
        argv_of, factory = _BARE[app]
        argv = argv_of(factory, port, workers)
        with BenchServer(argv, self._env(), port):
            return await self.load.run(f"http://127.0.0.1:{port}/v1/idgenerator/{DISPENSE_TYPE}/id")

    async def single(
        self, client: aioredis.Redis, server: str, workers: int, token: str | None = None
    ) -> Any:
        keys = int(60_000 * workers * self.seconds * self.load.rounds) + 100_000
        path = f"/v1/idgenerator/{DISPENSE_TYPE}/id"
        return await self.dispenser(client, workers, path, keys, server, token=token)

    async def _granian_round(self, client: aioredis.Redis, workers: int) -> dict[str, Any]:
        """a. and b. on granian, in the same terms as uvicorn's."""
        bare = await self.bare("granian", workers)
        rsgi = await self.bare("granian_rsgi", workers)
        single = await self.single(client, "granian", workers)
        with_token = await self.single(client, "granian", workers, self.issuer.token())
        return {
            "granian_single_token_rps": round(with_token["rps"]),
            "granian_single_token_p99_ms": round(with_token["p99_ms"], 3),
            "granian_single_token_vs_single": round(with_token["rps"] / max(single["rps"], 1), 3),
            "granian_single_token_non_2xx": with_token["non_2xx"],
            "granian_bare_rps": round(bare["rps"]),
            "granian_bare_p99_ms": round(bare["p99_ms"], 3),
            "granian_bare_rsgi_rps": round(rsgi["rps"]),
            "granian_bare_rsgi_p99_ms": round(rsgi["p99_ms"], 3),
            "granian_single_rps": round(single["rps"]),
            "granian_single_p50_ms": round(single["p50_ms"], 3),
            "granian_single_p99_ms": round(single["p99_ms"], 3),
            "granian_single_keys_served": single["keys_served"],
            "granian_non_2xx": {
                "bare": bare["non_2xx"],
                "bare_rsgi": rsgi["non_2xx"],
                "single": single["non_2xx"],
            },
            "granian_pool_ran_dry": single["pool_ran_dry"],
        }

    async def _round(self, client: aioredis.Redis, workers: int) -> dict[str, Any]:
        single_path = f"/v1/idgenerator/{DISPENSE_TYPE}/id"
        bare = await self.bare("uvicorn", workers)
        bare_asgi = await self.bare("uvicorn_asgi", workers)
        single = await self.single(client, "uvicorn", workers)
        batch_keys = round(BATCH_KEYS_PER_S * self.batch_load.duration) + 1_000_000
        batch = await self.dispenser(
            client,
            workers,
            f"/v1/keys/{DISPENSE_TYPE}?count={BATCH}",
            batch_keys,
            load=self.batch_load,
        )
        port = free_port()
        env = self._env(**{bench_servers.BASELINE_DSN_ENV: self.settings.postgres_dsn})
        with BenchServer(
            uvicorn_argv("keydispenser_ops.bench.servers:pg_baseline", port, workers), env, port
        ):
            baseline = await self.load.run(f"http://127.0.0.1:{port}{single_path}")
        return {
            "bare_rps": round(bare["rps"]),
            "bare_p99_ms": round(bare["p99_ms"], 3),
            "bare_asgi_rps": round(bare_asgi["rps"]),
            "bare_asgi_p99_ms": round(bare_asgi["p99_ms"], 3),
            "single_rps": round(single["rps"]),
            "single_p50_ms": round(single["p50_ms"], 3),
            "single_p99_ms": round(single["p99_ms"], 3),
            "batch_rps": round(batch["rps"]),
            "batch_keys_per_s": round(batch["keys_served"] / self.batch_load.duration),
            "batch_p99_ms": round(batch["p99_ms"], 3),
            "pg_baseline_rps": round(baseline["rps"]),
            "pg_baseline_p99_ms": round(baseline["p99_ms"], 3),
            "non_2xx": {
                "bare": bare["non_2xx"],
                "bare_asgi": bare_asgi["non_2xx"],
                "single": single["non_2xx"],
                "batch": batch["non_2xx"],
                "pg_baseline": baseline["non_2xx"],
            },
            "single_keys_served": single["keys_served"],
            "pool_ran_dry": single["pool_ran_dry"] or batch["pool_ran_dry"],
            # The batch phase emptied its keys early: batch_keys_per_s is a lower bound.
            "batch_pool_ran_dry": batch["pool_ran_dry"],
            **(await self._granian_round(client, workers) if self.with_granian else {}),
        }

    def _report(self, runs: dict[str, Any], cores: int) -> dict[str, Any]:
        first = runs["workers_1"]
        report: dict[str, Any] = {
            "benchmark": "dispense",
            "load_generator": self.load.name,
            "rounds": self.load.rounds,  # each measure the best of this many
            # The bundled client saturates before the servers do: its *_vs_bare ratios
            # compare two figures of the client (near 1), not the server's ceiling.
            "ceilings_measured": self.load.wrk is not None,
            "connections": CONNECTIONS,
            "seconds_each": self.seconds,
            "batch_seconds": self.batch_seconds,
            "cores": cores,
            # The headline fields: one worker (unprefixed: uvicorn, as before granian).
            **{k: first[k] for k in ("bare_rps", "single_rps", "single_p99_ms")},
            **{k: first[k] for k in ("batch_keys_per_s", "pg_baseline_rps")},
            **{f"uvicorn_{k}": first[k] for k in HEADLINE},
            **{f"granian_{k}": first[f"granian_{k}"] for k in HEADLINE if self.with_granian},
            "runs": runs,
            "targets": TARGETS,
        }
        for name, run in runs.items():
            run["single_vs_bare"] = round(run["single_rps"] / max(run["bare_rps"], 1), 3)
            run["single_vs_bare_asgi"] = round(run["single_rps"] / max(run["bare_asgi_rps"], 1), 3)
            run["single_vs_pg_baseline"] = round(
                run["single_rps"] / max(run["pg_baseline_rps"], 1), 1
            )
            run["targets_met"] = {
                "single_vs_bare": run["single_vs_bare"] >= TARGETS["single_vs_bare"],
                "single_vs_pg_baseline": run["single_vs_pg_baseline"]
                >= TARGETS["single_vs_pg_baseline"],
                "batch_keys_per_s": run["batch_keys_per_s"] >= TARGETS["batch_keys_per_s"],
                "single_p99_ms": run["single_p99_ms"] <= TARGETS["single_p99_ms"],
                **(_granian_targets_met(run) if self.with_granian else {}),
            }
            report[f"{name}_targets_met"] = all(run["targets_met"].values())
        # Each server against its own ceiling (one worker).
        report["uvicorn_single_vs_bare_asgi"] = first["single_vs_bare_asgi"]
        if self.with_granian:
            for key in (
                "bare_rsgi_rps",
                "single_vs_bare_rsgi",
                "single_p99_vs_bare_rsgi",
                "single_token_rps",
                "single_token_vs_single",
            ):
                report[f"granian_{key}"] = first[f"granian_{key}"]
        return report

    async def _prepare_baseline(self) -> None:
        await ensure_database(self.settings.postgres_dsn)  # through the maintenance database
        conn = await asyncpg.connect(self.settings.postgres_dsn)
        try:
            await conn.execute(bench_servers.CREATE_BASELINE)
            await conn.execute(bench_servers.FILL_BASELINE, int(5_000 * self.seconds) + 50_000)
            await conn.execute(bench_servers.INDEX_BASELINE)
        finally:
            await conn.close()

    async def _drop_baseline(self) -> None:
        conn = await asyncpg.connect(self.settings.postgres_dsn)
        try:
            await conn.execute(f"DROP TABLE IF EXISTS {bench_servers.BASELINE_TABLE}")
        finally:
            await conn.close()


def _granian_targets_met(run: dict[str, Any]) -> dict[str, bool]:
    run["granian_single_vs_uvicorn_bare"] = round(
        run["granian_single_rps"] / max(run["bare_rps"], 1), 3
    )
    run["granian_single_vs_bare_rsgi"] = round(
        run["granian_single_rps"] / max(run["granian_bare_rsgi_rps"], 1), 3
    )
    run["granian_single_p99_vs_bare_rsgi"] = round(
        run["granian_single_p99_ms"] / max(run["granian_bare_rsgi_p99_ms"], 0.001), 3
    )
    return {
        "granian_single_vs_uvicorn_bare": run["granian_single_vs_uvicorn_bare"]
        >= TARGETS["granian_single_vs_uvicorn_bare"],
        "granian_single_p99_ms": run["granian_single_p99_ms"] <= TARGETS["granian_single_p99_ms"],
        "granian_single_vs_bare_rsgi": run["granian_single_vs_bare_rsgi"]
        >= TARGETS["granian_single_vs_bare_rsgi"],
        "granian_single_p99_vs_bare_rsgi": run["granian_single_p99_vs_bare_rsgi"]
        <= TARGETS["granian_single_p99_vs_bare_rsgi"],
    }


async def run(settings: Settings, seconds: float, options: Options) -> dict[str, Any]:
    load, servers = options.load, options.servers
    if seconds < 1:
        raise ConfigError("bench dispense --seconds: at least 1")
    unknown = set(servers) - set(SERVERS)
    if "uvicorn" not in servers or unknown:
        raise ConfigError("bench dispense --servers: uvicorn, optionally with granian")
    with tempfile.TemporaryDirectory(prefix="kd-bench-") as work:
        return await Bench(settings, seconds, Path(work), load, servers, options.rounds).run()

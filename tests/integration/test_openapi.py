"""/openapi.json documents every route, and schemathesis finds no 5xx or contract breach."""

from __future__ import annotations

import asyncio
import re
import sys
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from starlette.routing import Route

from dispenser import mosip
from dispenser.routes import ROUTES
from shared.domain.apikeys import new_api_key
from shared.stores.hot.hot_store import HotStore
from tests.conftest import small_types
from tests.integration.fixtures import (
    Servers,
    dispenser_over_http,
    end_lease_settling,
    make_settings,
)

CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
    )
)


@pytest.mark.parametrize("with_mosip", [False, True])
async def test_every_route_is_documented(
    servers: Servers, database: str, redis_client: aioredis.Redis, with_mosip: bool
) -> None:
    """MOSIP's paths are documented (with the methods they serve) when configured."""
    types = small_types()
    types["farmer"]["ledger"] = types["shortlink"]["ledger"] = True
    extra = {"mosip": {"uin": "farmer", "vid": "shortlink"}} if with_mosip else {}
    settings = make_settings(servers, database, id_types=types, dispenser=extra)
    async with dispenser_over_http(settings) as client:
        doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    documented = {(path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
    served = {
        (route.path, method)
        for route in ROUTES
        if isinstance(route, Route) and route.path not in mosip.METHODS
        for method in route.methods or ()
        if method != "HEAD"
    }
    if with_mosip:
        served |= {(path, m) for path, methods in mosip.METHODS.items() for m in methods}
    assert served == documented
    id_type = doc["paths"]["/v1/keys/{id_type}"]["post"]["parameters"][0]
    assert id_type["schema"]["enum"] == ["farmer", "shortlink"]


@pytest.mark.parametrize(
    "auth", ["open", "with-api-key", "without-api-key", "rate-limited", "mosip"]
)
async def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    servers: Servers,
    database: str,
    redis_client: aioredis.Redis,
    hot: HotStore,
    tmp_path: Path,
    auth: str,
) -> None:
    """Open API; API keys configured and sent; configured and not sent (every 401); a
    client whose rate limit (charged per key) refuses most requests (429, and 422 for
    a batch over its burst). Every answer is checked against the document, error
    answers' X-Request-Id header included."""
    types = small_types()
    types["shortlink"]["ledger"] = True
    types["events"] = {"kind": "snowflake"}  # minted: validate, decode, 503 until leased
    extra: dict[str, object] = {}
    if auth == "mosip":  # MOSIP's paths too (no keysync here: a PUT waits briefly)
        types["farmer"]["ledger"] = True
        extra = {"mosip": {"uin": "farmer", "vid": "shortlink", "ledger_wait_s": 0.2}}
    key, key_digest = new_api_key()
    fuzzer: dict[str, object] = {"name": "fuzzer", "sha256": key_digest}
    if auth == "rate-limited":
        fuzzer |= {"rate_per_s": 20, "burst": 10}
    clients = [] if auth in ("open", "mosip") else [fuzzer]
    settings = make_settings(
        servers, database, id_types=types, dispenser={"auth": {"api_keys": clients}, **extra}
    )
    headers = ["--header", f"X-API-Key: {key}"] if auth in ("with-api-key", "rate-limited") else []
    await hot.push("farmer", [f"{i:010d}" for i in range(5_000)], uuid.uuid4().hex)
    await hot.push("shortlink", [f"S{i:06d}" for i in range(5_000)], uuid.uuid4().hex)
    await end_lease_settling(servers.redis_url, redis_client)
    async with dispenser_over_http(settings) as client:
        schemathesis = Path(sys.executable).parent / "st"
        process = await asyncio.create_subprocess_exec(
            str(schemathesis),
            "run",
            f"{client.base_url}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            "25",
            "--seed",
            "20261126",
            # One worker: CPython 3.11's ast module keeps its recursion depth in
            # interpreter state, and two threads parsing at once (hypothesis describes
            # lambdas with ast.parse) can fail with "AST constructor recursion depth
            # mismatch" (python/cpython#106905), a failure of the fuzzer, not of us.
            "--workers",
            "1",
            *headers,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), timeout=300)
    report = output.decode(errors="replace")
    assert process.returncode == 0, report
    # Every generated case passed every check (warnings, e.g. that most generated
    # id_values are not valid keys of the type, are not failures).
    counts = re.search(r"(\d+) generated, (\d+) passed", report)
    assert counts is not None and counts.group(1) == counts.group(2), report
    assert int(counts.group(1)) > 100

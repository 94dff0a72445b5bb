"""Two environments on one Redis server and database, each with its own
``redis_namespace``: neither sees the other's hot lists, fence or ledger."""

from __future__ import annotations

import httpx
import redis.asyncio as aioredis

from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.stores.hot.hot_store import HotStore
from tests.conftest import small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

OTHER = "staging"


def environment(servers: Servers, database: str, namespace: str) -> Settings:
    types = small_types()
    types["farmer"]["ledger"] = True
    return make_settings(servers, database, id_types=types, redis_namespace=namespace)


async def take(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("/v1/idgenerator/farmer/id")


async def test_two_namespaces_on_one_redis_db_never_touch_each_other(
    servers: Servers, database: str, redis_client: aioredis.Redis
) -> None:
    prod, staging = (environment(servers, database, ns) for ns in ("kd", OTHER))
    hot_prod, hot_staging = HotStore.from_settings(prod), HotStore.from_settings(staging)
    try:
        await hot_prod.push("farmer", ["p1", "p2", "p3"], "batch-1")
        await hot_staging.push("farmer", ["s1", "s2"], "batch-1")  # same batch id, own marker
        async with dispenser_over_http(prod) as a, dispenser_over_http(staging) as b:
            assert [(await take(b)).json()["response"]["id"] for _ in range(2)] == ["s1", "s2"]
            empty = await take(b)
            assert empty.status_code == 503 and empty.json()["errors"][0]["errorCode"] == "IDG-001"
            assert (await take(a)).json()["response"]["id"] == "p1"
        # Each namespace's ledger stream holds its own issues only.
        for ns, keys in (("kd", "p1"), (OTHER, "s1 s2")):
            assert await issued_in_ledger(redis_client, ns) == keys
        # A fence that sees another server discards its own namespace's lists only.
        await hot_staging.push("farmer", ["s3"], "batch-2")
        await redis_client.set(redis_keys.fence_key("kd"), "another-server:another-replid")
        assert (await hot_prod.pop("farmer", 5)).discarded == 2
        assert (await hot_staging.pop("farmer", 5)).keys == ["s3"]
        assert await hot_staging.discarded_counts() == {}
        assert await hot_prod.discarded_counts() == {redis_keys.hot_list_key("kd", "farmer"): 2}
    finally:
        await hot_prod.close()
        await hot_staging.close()
    names = {str(k) for k in await redis_client.keys("*")}
    assert all(k.startswith(("kd:", f"{OTHER}:")) for k in names)
    # Literal names: the default namespace keeps the names deployments already hold.
    for ns in ("kd", OTHER):
        assert {f"{ns}:fence", f"{ns}:hot:registry", f"{ns}:ledger", f"{ns}:sync:record"} <= names
    assert "kd:hot:farmer" not in names and "kd:discarded" in names


async def issued_in_ledger(client: aioredis.Redis, namespace: str) -> str:
    entries = await client.xrange(redis_keys.ledger_stream_key(namespace)) or []
    return " ".join(str(fields["keys"]) for _, fields in entries if fields)

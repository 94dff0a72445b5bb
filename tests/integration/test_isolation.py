"""Every door belongs to one API client: idempotency records, ledger answers, rate limits."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from keysync.ledger import LedgerDrain
from shared.domain import redis_keys
from shared.domain.apikeys import new_api_key
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.batch import Applied
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres.cold_store import ColdStore
from tests.conftest import NS, small_types
from tests.integration.fixtures import Servers, dispenser_over_http, make_settings

KEYS = [f"L{i:06d}" for i in range(200)]  # well-formed base62 keys of length 7
CLIENTS = ("alpha", "beta", "auditor", "slow")


@pytest.fixture
def api_keys() -> dict[str, str]:
    return {name: new_api_key()[0] for name in CLIENTS}


@pytest.fixture
def settings(
    servers: Servers, database: str, redis_client: aioredis.Redis, api_keys: dict[str, str]
) -> Settings:
    from shared.domain.apikeys import digest

    types = small_types()
    types["shortlink"]["ledger"] = True
    clients: list[dict[str, Any]] = [
        {"name": "alpha", "sha256": digest(api_keys["alpha"])},
        {"name": "beta", "sha256": digest(api_keys["beta"])},
        {"name": "auditor", "sha256": digest(api_keys["auditor"]), "ledger_admin": True},
        {"name": "slow", "sha256": digest(api_keys["slow"]), "rate_per_s": 0.01, "burst": 5},
    ]
    return make_settings(
        servers, database, id_types=types, dispenser={"auth": {"api_keys": clients}}
    )


@pytest.fixture
async def http(settings: Settings, hot: HotStore) -> AsyncIterator[httpx.AsyncClient]:
    await hot.push("shortlink", KEYS, uuid.uuid4().hex)
    await hot.push("farmer", [f"{i:010d}" for i in range(100)], uuid.uuid4().hex)
    async with dispenser_over_http(settings) as client:
        yield client


@pytest.fixture
async def drain(settings: Settings, hot: HotStore) -> AsyncIterator[LedgerDrain]:
    cold = await ColdStore.connect(settings.postgres_dsn)
    drain = LedgerDrain(
        LedgerStream(hot.endpoint, hot.namespace),
        cold,
        build_id_types(settings),
        "test-consumer",
        1_000,
    )
    assert await drain.drain_once(block_ms=10) is None  # creates the consumer group
    yield drain
    await cold.close()


def auth(api_keys: dict[str, str], name: str, **extra: str) -> dict[str, str]:
    return {"X-API-Key": api_keys[name], **extra}


async def drain_all(drain: LedgerDrain) -> list[Applied]:
    applied = []
    while (batch := await drain.drain_once(block_ms=10)) is not None:
        applied.append(batch)
    return applied


@pytest.mark.parametrize(
    ("path", "params"),
    [("/v1/idgenerator/farmer/id", {}), ("/v1/keys/shortlink", {"count": "3"})],
)
async def test_two_clients_with_one_idempotency_key_get_different_keys(
    http: httpx.AsyncClient, api_keys: dict[str, str], path: str, params: dict[str, str]
) -> None:
    same = {"Idempotency-Key": "req-7"}
    alpha = await http.post(path, params=params, headers=auth(api_keys, "alpha", **same))
    beta = await http.post(path, params=params, headers=auth(api_keys, "beta", **same))
    assert alpha.status_code == beta.status_code == 200
    assert "Idempotent-Replayed" not in beta.headers
    assert alpha.json() != beta.json()
    # Each client's own retry still replays its own answer.
    again = await http.post(path, params=params, headers=auth(api_keys, "beta", **same))
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (
        again.json()["response" if "idgenerator" in path else "keys"]
        == (beta.json()["response" if "idgenerator" in path else "keys"])
    )


def test_the_record_key_holds_the_client() -> None:
    """The control: keyed on the header alone, both clients would share one record."""
    assert redis_keys.idempotency_key(NS, "alpha", "req-7") != redis_keys.idempotency_key(
        NS, "beta", "req-7"
    )
    # ``client\nkey`` is one pair only: no (client, key) split collides with another.
    assert redis_keys.idempotency_key(NS, "a", "b-c") != redis_keys.idempotency_key(NS, "a-b", "c")


async def test_a_record_of_another_client_under_this_name_never_replays(
    http: httpx.AsyncClient, api_keys: dict[str, str], redis_client: aioredis.Redis
) -> None:
    """The stored fingerprint holds the client too: a record planted (or keyed the old
    way) under beta's record name is refused, never handed to beta."""
    first = await http.post(
        "/v1/keys/shortlink",
        params={"count": "1"},
        headers=auth(api_keys, "alpha", **{"Idempotency-Key": "k"}),
    )
    record = await redis_client.get(redis_keys.idempotency_key(NS, "alpha", "k"))
    assert record is not None
    await redis_client.set(redis_keys.idempotency_key(NS, "beta", "k"), record)
    beta = await http.post(
        "/v1/keys/shortlink",
        params={"count": "1"},
        headers=auth(api_keys, "beta", **{"Idempotency-Key": "k"}),
    )
    assert beta.status_code == 422
    assert first.json()["keys"][0] not in beta.text


async def test_the_ledger_answers_only_the_issuer_or_a_ledger_admin(
    http: httpx.AsyncClient, api_keys: dict[str, str], drain: LedgerDrain
) -> None:
    got = await http.post(
        "/v1/keys/shortlink",
        params={"count": "2"},
        headers=auth(api_keys, "alpha", **{"Idempotency-Key": "secret-order"}),
    )
    mine, other = got.json()["keys"]
    await drain_all(drain)
    own = (await http.get(f"/v1/keys/shortlink/{mine}", headers=auth(api_keys, "alpha"))).json()
    assert own["issued"] is True and own["client"] == "alpha"
    seen_by_beta = await http.get(f"/v1/keys/shortlink/{mine}", headers=auth(api_keys, "beta"))
    never = await http.get("/v1/keys/shortlink/Zzzzzzz", headers=auth(api_keys, "beta"))
    assert seen_by_beta.json() == {**never.json(), "key": mine}  # no oracle
    assert "secret-order" not in seen_by_beta.text and "alpha" not in seen_by_beta.text
    audit = await http.get(f"/v1/keys/shortlink/{mine}", headers=auth(api_keys, "auditor"))
    assert audit.json()["client"] == "alpha"

    # beta's marks are accepted (the ledger applies them later) but never applied.
    refused = await http.post(
        f"/v1/idgenerator/shortlink/id/{mine}/used", headers=auth(api_keys, "beta")
    )
    assert refused.status_code == 202
    await http.post(
        "/v1/keys/shortlink/used", json={"keys": [other]}, headers=auth(api_keys, "beta")
    )
    applied = await drain_all(drain)
    assert sum(a.used_refused for a in applied) == 2 and sum(a.used for a in applied) == 0
    after = (await http.get(f"/v1/keys/shortlink/{mine}", headers=auth(api_keys, "alpha"))).json()
    assert after["used"] is False

    await http.post(f"/v1/idgenerator/shortlink/id/{mine}/used", headers=auth(api_keys, "alpha"))
    await http.post(
        "/v1/keys/shortlink/used", json={"keys": [other]}, headers=auth(api_keys, "auditor")
    )
    applied = await drain_all(drain)
    assert sum(a.used for a in applied) == 2
    marked = (await http.get(f"/v1/keys/shortlink/{mine}", headers=auth(api_keys, "alpha"))).json()
    assert marked["used"] is True and marked["used_by"] == "alpha"
    by_audit = await http.get(f"/v1/keys/shortlink/{other}", headers=auth(api_keys, "auditor"))
    assert by_audit.json()["used_by"] == "auditor"


async def test_rate_limits_charge_per_key(
    http: httpx.AsyncClient, api_keys: dict[str, str], hot: HotStore
) -> None:
    """'slow' may take 5 keys at once (its burst), then must wait: not 5 requests."""
    before = await hot.depth("shortlink")
    too_big = await http.post(
        "/v1/keys/shortlink", params={"count": "50"}, headers=auth(api_keys, "slow")
    )
    assert too_big.status_code == 422
    assert "burst" in too_big.json()["errors"][0]["message"]
    assert too_big.headers["KD-Max-Count"] == "5"  # the largest count that can pass
    four = await http.post(
        "/v1/keys/shortlink", params={"count": "4"}, headers=auth(api_keys, "slow")
    )
    assert four.status_code == 200 and len(four.json()["keys"]) == 4
    two = await http.post(
        "/v1/keys/shortlink", params={"count": "2"}, headers=auth(api_keys, "slow")
    )
    assert two.status_code == 429 and int(two.headers["Retry-After"]) >= 1
    assert await hot.depth("shortlink") == before - 4

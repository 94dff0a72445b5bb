"""Every answer to "one ID", decided by ``dispenser.single.SingleId`` and driven here
without a server: a real service (``Dispenser``) on the in-memory ports."""

from __future__ import annotations

import json
from typing import Any
from weakref import WeakKeyDictionary

import pytest
from prometheus_client import CollectorRegistry

from dispenser import single
from dispenser.auth import Gate
from dispenser.metrics import DispenserMetrics
from dispenser.service import Dispenser, Stores
from dispenser.sources import Pool, Unknown
from shared.domain.apikeys import digest, new_api_key
from shared.domain.config import load_settings
from shared.domain.ports import (
    ColdInventory,
    HotLists,
    HotPool,
    KeyInventory,
    LedgerLookup,
    LedgerWrites,
    Nudges,
    RangeLeases,
)
from shared.stores.memory import MemoryCold, MemoryHot, MemoryLedger, MemoryNudges
from tests.conftest import EMPTY_CONFIG, TEST_SECRET, small_types

ALLOCATE = single.ALLOCATE_ONE


class Headers(dict[str, str]):
    """A request's headers, looked up by lower-case name (as every server gives them)."""


def dispenser(**dispenser_settings: Any) -> tuple[Dispenser, MemoryHot]:
    types = small_types()
    types["farmer"]["aliases"] = ["beneficiary"]
    types["shortlink"]["ledger"] = True
    settings = load_settings(
        EMPTY_CONFIG, permutation_key=TEST_SECRET, id_types=types, dispenser=dispenser_settings
    )
    hot = MemoryHot()
    ledger = MemoryLedger(hot)
    stores = Stores(hot, MemoryNudges(), ledger, ledger)
    return Dispenser(settings, stores, DispenserMetrics(CollectorRegistry())), hot


# Each service's single-ID answer, with its gate (whose rate limits hold across a test).
_ANSWERS: WeakKeyDictionary[Dispenser, single.SingleId] = WeakKeyDictionary()


def answers(service: Dispenser) -> single.SingleId:
    """The single-ID route's decision over ``service``'s sources, as ``create_app`` wires it."""
    found = _ANSWERS.get(service)
    if found is None:
        gate = Gate(service.settings.dispenser.auth, service.segments)
        found = _ANSWERS[service] = single.SingleId(
            service.by_segment(), gate, service.metrics, service.source
        )
    return found


async def ask(service: Dispenser, segment: str = "farmer", **headers: str) -> Any:
    """One request, the way the fast path asks: what is at hand, else the whole answer."""
    decision, lookup = answers(service), Headers(headers)
    at_hand = decision.at_hand_of(segment)
    answer = (at_hand and at_hand(lookup)) or await decision.answer(segment, lookup)
    status, answer_headers, body = answer
    return status, dict(answer_headers), json.loads(body)


async def stocked(service: Dispenser, hot: MemoryHot) -> None:
    """``farmer``'s stock filled from a plentiful list (two pops: the first learns it is)."""
    hot.fill("farmer", [f"{i:010d}" for i in range(5_000)])
    for _ in range(2):
        await service.pools["farmer"].one("setup")
    assert service.pools["farmer"].stocked() > 0


def test_the_in_memory_adapters_are_the_ports() -> None:
    """Checked by mypy: each adapter satisfies its port without a cast, every port of
    shared.domain.ports has one (the dispenser's, keygen's and keysync's)."""
    hot, cold = MemoryHot(), MemoryCold()
    ledger = MemoryLedger(hot)
    ports: tuple[
        HotPool, Nudges, LedgerWrites, LedgerLookup, RangeLeases, KeyInventory, ColdInventory,
        HotLists,
    ] = (hot, MemoryNudges(), ledger, ledger, cold, cold, cold, hot)  # fmt: skip
    assert len(ports) == 8


async def test_one_id_is_the_envelope_around_a_key_of_the_pool() -> None:
    service, hot = dispenser()
    hot.fill("farmer", ["3029384756"])
    status, headers, body = await ask(service)
    assert (status, headers) == (200, {"content-type": "application/json"})
    assert body["id"] == "openg2p.idgenerator" and body["errors"] == []
    assert body["response"] == {"id": "3029384756"}
    assert body["responsetime"].endswith("Z")


async def test_a_plentiful_pool_fills_the_stock_and_later_ids_need_no_pop() -> None:
    service, hot = dispenser()
    hot.fill("farmer", [f"{i:010d}" for i in range(5_000)])
    await ask(service)  # the first pop learns the list is plentiful
    await ask(service)  # this one's pop takes the stock too
    pops = len(hot.pops)
    answers = [await ask(service) for _ in range(100)]
    assert len(hot.pops) <= pops + 1  # a refill at most, once the stock is down to half
    keys = [body["response"]["id"] for _, _, body in answers]
    assert len(set(keys)) == 100
    issued = service.metrics.registry.get_sample_value(
        "kd_keys_issued_total", {"id_type": "farmer"}
    )
    assert issued == 102


async def test_an_alias_is_served_as_its_type() -> None:
    service, hot = dispenser()
    hot.fill("farmer", ["3029384756"])
    status, _, body = await ask(service, "beneficiary")
    assert status == 200 and body["response"]["id"] == "3029384756"


@pytest.mark.parametrize(
    ("segment", "status", "code"),
    [("nosuch", 404, "IDG-003"), ("Far mer", 422, "IDG-004")],
)
async def test_a_type_that_is_not_one_is_refused_in_the_envelope(
    segment: str, status: int, code: str
) -> None:
    service, _ = dispenser()
    got, headers, body = await ask(service, segment, **{"x-request-id": "req-7"})
    assert got == status and body["errors"][0]["errorCode"] == code
    assert headers["x-request-id"] == "req-7" and "req-7" in body["errors"][0]["message"]
    errors = service.metrics.registry.get_sample_value("kd_request_errors_total", {"code": code})
    assert errors == 1


async def test_an_empty_pool_is_503_with_retry_after() -> None:
    service, _ = dispenser(retry_after_s=3)
    status, headers, body = await ask(service)
    assert status == 503 and body["errors"][0]["errorCode"] == "IDG-001"
    assert headers["retry-after"] == "3"


async def test_an_idempotency_key_replays_its_answer_and_says_so() -> None:
    service, hot = dispenser()
    hot.fill("farmer", ["3029384756", "2013023805"])
    first = await ask(service, **{"idempotency-key": "order-1"})
    again = await ask(service, **{"idempotency-key": "order-1"})
    assert first[0] == again[0] == 200
    assert first[2]["response"] == again[2]["response"] == {"id": "3029384756"}
    assert "idempotent-replayed" not in first[1]
    assert again[1]["idempotent-replayed"] == "true"
    status, _, body = await ask(service, **{"idempotency-key": "bad key"})
    assert status == 422 and body["errors"][0]["errorCode"] == "IDG-004"
    assert await hot.depth("farmer") == 1  # the refused request took nothing


async def test_api_keys_are_checked_before_anything_is_popped() -> None:
    key, _ = new_api_key()
    client = {"name": "registry", "sha256": digest(key), "id_types": ["shortlink"]}
    service, hot = dispenser(auth={"api_keys": [client]})
    hot.fill("farmer", ["3029384756"])
    status, headers, body = await ask(service)
    assert status == 401 and body["errors"][0]["errorCode"] == "IDG-008"
    assert headers["www-authenticate"].startswith("Bearer")
    status, _, body = await ask(service, authorization=f"Bearer {key}")
    assert status == 403 and body["errors"][0]["errorCode"] == "IDG-009"
    assert await hot.depth("farmer") == 1


async def test_a_stocked_key_is_not_handed_to_a_caller_without_an_api_key() -> None:
    key, _ = new_api_key()
    client = {"name": "registry", "sha256": digest(key), "id_types": ["*"]}
    service, hot = dispenser(auth={"api_keys": [client]})
    await stocked(service, hot)
    held = service.pools["farmer"].stocked()
    status, _, body = await ask(service)
    assert status == 401 and body["errors"][0]["errorCode"] == "IDG-008"
    assert service.pools["farmer"].stocked() == held  # nothing handed out
    status, _, body = await ask(service, **{"x-api-key": key})
    assert status == 200 and service.pools["farmer"].stocked() == held - 1


async def test_an_idempotent_retry_is_replayed_though_a_key_is_at_hand() -> None:
    service, hot = dispenser()
    await stocked(service, hot)
    first = await ask(service, **{"idempotency-key": "order-1"})
    again = await ask(service, **{"idempotency-key": "order-1"})
    assert first[0] == again[0] == 200
    assert again[2]["response"] == first[2]["response"]
    assert again[1]["idempotent-replayed"] == "true"


def test_a_type_is_resolved_once_into_the_source_the_path_uses() -> None:
    """Its name and each alias resolve to one source, built at start-up, carrying the
    type the rest of the path uses; a name that is no type resolves to a source that
    refuses it (where it is used, after the API-key check)."""
    service, _ = dispenser()
    sources = service.by_segment()
    farmer = sources["farmer"]
    assert sources["beneficiary"] is farmer
    assert isinstance(farmer, Pool) and farmer.id_type is service.id_types["farmer"]
    assert "nosuch" not in sources
    unknown = service.source("nosuch")
    assert isinstance(unknown, Unknown) and unknown.name == "nosuch"


async def test_a_caller_without_a_key_is_not_told_which_types_exist() -> None:
    key, _ = new_api_key()
    client = {"name": "registry", "sha256": digest(key), "id_types": ["*"]}
    service, _ = dispenser(auth={"api_keys": [client]})
    status, _, body = await ask(service, "nosuch")
    assert status == 401 and body["errors"][0]["errorCode"] == "IDG-008"
    status, _, body = await ask(service, "nosuch", **{"x-api-key": key})
    assert status == 404 and body["errors"][0]["errorCode"] == "IDG-003"


async def test_a_ledger_type_records_each_key_to_its_client_and_keeps_no_stock() -> None:
    key, _ = new_api_key()
    client = {"name": "registry", "sha256": digest(key), "id_types": ["*"]}
    service, hot = dispenser(auth={"api_keys": [client]})
    hot.fill("shortlink", [f"s{i:06d}" for i in range(5_000)])
    for _ in range(3):
        status, _, _ = await ask(service, "shortlink", **{"x-api-key": key})
        assert status == 200
    assert [issue.client for issue in hot.issued] == ["registry"] * 3
    assert await hot.depth("shortlink") == 4_997  # popped one by one: no stock


async def test_an_unexpected_failure_is_a_500_logged_with_its_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service, hot = dispenser()

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    hot.pop = hot.pop_coalesced = broken  # type: ignore[method-assign]
    status, headers, body = await ask(service, **{"x-request-id": "req-9"})
    assert status == 500 and body["errors"][0]["errorCode"] == "IDG-500"
    assert "boom" not in json.dumps(body)  # the detail goes to the log only
    assert "request_crashed" in caplog.text and "boom" in caplog.text
    assert headers["x-request-id"] == "req-9"


async def test_every_answer_is_timed_once() -> None:
    service, hot = dispenser()
    hot.fill("farmer", ["3029384756"])
    await ask(service)
    await ask(service)  # 503
    await ask(service, "nosuch")  # 404
    count = service.metrics.registry.get_sample_value(
        "kd_request_seconds_count", {"route": ALLOCATE}
    )
    assert count == 3

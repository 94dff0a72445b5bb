"""The client's reading of the dispenser's answers, and the sync client on a fake server."""

from __future__ import annotations

import json

import httpx
import pytest

from keydispenser_client import Buffering, KeyClient, KeyspaceExhausted, RequestRefused
from keydispenser_client.protocol import (
    Backoff,
    Keys,
    Shrink,
    Stop,
    Wait,
    fetched,
    retry_after,
    shrunk,
)


def error_body(code: str) -> bytes:
    return json.dumps({"errors": [{"errorCode": code, "message": "m"}]}).encode()


def test_keys_and_replays_are_read() -> None:
    outcome = fetched(200, {"idempotent-replayed": "true"}, b'{"keys":["a","b"]}', Backoff())
    assert outcome == Keys(["a", "b"], replayed=True)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_the_wait(status: int) -> None:
    outcome = fetched(status, {"retry-after": "7"}, error_body("IDG-001"), Backoff())
    assert outcome == Wait(7.0, f"{status} IDG-001", from_server=True)


def test_failures_without_retry_after_back_off_doubling_until_an_answer() -> None:
    backoff = Backoff()
    delays = [fetched(500, {}, b"", backoff) for _ in range(3)]
    assert [d.seconds for d in delays if isinstance(d, Wait)] == [0.05, 0.1, 0.2]
    fetched(200, {}, b'{"keys":[]}', backoff)
    assert backoff.delay == 0.05


def test_410_stops_with_keyspace_exhausted_and_4xx_with_refused() -> None:
    gone = fetched(410, {}, error_body("IDG-002"), Backoff())
    assert isinstance(gone, Stop) and isinstance(gone.error, KeyspaceExhausted)
    refused = fetched(403, {}, error_body("IDG-009"), Backoff())
    assert isinstance(refused, Stop) and isinstance(refused.error, RequestRefused)
    assert (refused.error.status, refused.error.code) == (403, "IDG-009")


@pytest.mark.parametrize(
    ("raw", "seconds"), [("3", 3.0), (" 0 ", 0.0), ("soon", None), (None, None)]
)
def test_retry_after_header(raw: str | None, seconds: float | None) -> None:
    assert retry_after(raw) == seconds


def test_buffer_marks_default_to_a_double_buffer_and_are_checked() -> None:
    assert (Buffering(batch=500).mark_low, Buffering(batch=500).mark_high) == (500, 1000)
    for bad in ({"batch": 0}, {"low": 10, "high": 10}, {"fetchers": 0}):
        with pytest.raises(ValueError):
            Buffering(**bad)


def test_sync_client_hands_out_its_buffer_before_raising_410() -> None:
    answers = iter([httpx.Response(200, json={"keys": ["a", "b"]})])

    def handler(request: httpx.Request) -> httpx.Response:
        return next(answers, httpx.Response(410, content=error_body("IDG-002")))

    transport = httpx.MockTransport(handler)
    with KeyClient(
        "http://x", "t", buffering=Buffering(batch=2, low=1, high=9), transport=transport
    ) as c:
        assert [c.take(5), c.take(5)] == ["a", "b"]
        with pytest.raises(KeyspaceExhausted):
            c.take(5)


def test_sync_client_sleeps_retry_after_then_asks_again_with_the_same_key() -> None:
    events: list[tuple[str, object]] = []
    answers = iter(
        [
            httpx.Response(503, headers={"Retry-After": "4"}, content=error_body("IDG-001")),
            httpx.Response(200, json={"keys": ["k"]}),
        ]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        events.append(("request", request.headers["idempotency-key"]))
        return next(answers, httpx.Response(503, content=error_body("IDG-001")))

    def sleep(seconds: float) -> None:
        events.append(("sleep", seconds))

    transport = httpx.MockTransport(handler)
    buffering = Buffering(batch=1, low=1, high=2)
    with KeyClient("http://x", "t", buffering=buffering, transport=transport, sleep=sleep) as c:
        assert c.take(5) == "k"
    assert events[1] == ("sleep", 4.0)
    assert events[0][0] == events[2][0] == "request" and events[0][1] == events[2][1]


def test_keys_are_read_from_the_dispensers_bytes_and_from_any_json() -> None:
    assert fetched(200, {}, b'{"keys":["a","b"]}', Backoff()) == Keys(["a", "b"])
    assert fetched(200, {}, b'{ "keys": ["a", "b"] }', Backoff()) == Keys(["a", "b"])
    assert fetched(200, {}, b'{"keys":["a\\u0041"]}', Backoff()) == Keys(["aA"])
    assert fetched(200, {}, b'{"keys":[]}', Backoff()) == Keys([])


def test_a_malformed_answer_is_asked_again() -> None:
    assert isinstance(fetched(200, {}, b"<html>", Backoff()), Wait)
    assert isinstance(fetched(200, {}, b'{"keys":[1]}', Backoff()), Wait)


def test_a_count_above_the_burst_is_a_shrink_and_lowers_the_batch_and_default_marks() -> None:
    body = error_body("IDG-004")
    assert fetched(422, {"kd-max-count": "40"}, body, Backoff()) == Shrink(40)
    assert isinstance(fetched(422, {}, body, Backoff()), Stop)  # names no count: refused
    assert isinstance(fetched(422, {"kd-max-count": "0"}, body, Backoff()), Stop)
    smaller = shrunk(Buffering(), 40)
    assert smaller is not None and (smaller.batch, smaller.mark_low, smaller.mark_high) == (
        40,
        40,
        80,
    )
    assert shrunk(Buffering(batch=30), 40) is None  # not above it: nothing to lower
    kept = shrunk(Buffering(batch=100, low=10, high=500), 40)
    assert kept is not None and (kept.mark_low, kept.mark_high) == (10, 500)


def test_sync_client_lowers_its_batch_once_with_a_fresh_idempotency_key() -> None:
    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        count = request.url.params["count"]
        seen.append((count, request.headers["idempotency-key"]))
        if int(count) > 3:
            headers = {"KD-Max-Count": "3"}
            return httpx.Response(422, headers=headers, content=error_body("IDG-004"))
        return httpx.Response(200, json={"keys": [f"k{len(seen)}-{i}" for i in range(3)]})

    with KeyClient("http://x", "t", transport=httpx.MockTransport(handler)) as c:
        assert c.take(5) == "k2-0"
    assert [count for count, _ in seen[:2]] == ["1000", "3"]
    assert seen[0][1] != seen[1][1]  # the count changed: a new request, a new key


def test_every_fetcher_told_of_the_burst_at_once_goes_on_with_the_lowered_batch() -> None:
    """Several fetchers ask for the default batch at once and are all refused with the
    burst; the first lowers the batch, the others ask again with it: none fails."""
    import threading

    counts: list[str] = []
    lock = threading.Lock()
    refused_all = threading.Barrier(3, timeout=5)

    def handler(request: httpx.Request) -> httpx.Response:
        count = request.url.params["count"]
        with lock:
            counts.append(count)
        if int(count) > 3:
            refused_all.wait()  # all three fetchers are refused before any retries
            headers = {"KD-Max-Count": "3"}
            return httpx.Response(422, headers=headers, content=error_body("IDG-004"))
        return httpx.Response(200, json={"keys": [f"k{len(counts)}-{i}" for i in range(3)]})

    buffering = Buffering(fetchers=3)
    with KeyClient(
        "http://x", "t", buffering=buffering, transport=httpx.MockTransport(handler)
    ) as c:
        keys = c.take_many(9, timeout_s=5)
    assert len(set(keys)) == 9
    assert counts[:3] == ["1000"] * 3 and set(counts[3:]) == {"3"}

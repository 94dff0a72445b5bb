"""dispenser.rsgi: an ASGI app's messages over an RSGI protocol (a recording stand-in
for granian's; the real one is exercised by every ``both_servers`` test)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.types import Message, Receive, Scope, Send

from dispenser import codes
from dispenser.auth import Gate
from dispenser.fastpath import FastPath
from dispenser.metrics import DispenserMetrics
from dispenser.rsgi import HTTPProtocol, asgi_scope, serve_asgi
from dispenser.rsgi import Scope as RsgiScope
from dispenser.single import SingleId
from dispenser.sources import Unknown
from shared.domain.config import AuthConfig
from shared.domain.errors import PoolEmpty
from shared.domain.tiers import Popped


class FakeHeaders:
    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def items(self) -> list[tuple[str, str]]:
        return self.pairs

    def __contains__(self, key: str) -> bool:
        return any(name == key for name, _ in self.pairs)

    def get(self, key: str, default: Any = None) -> Any:
        return next((value for name, value in self.pairs if name == key), default)


@dataclass
class FakeScope:
    headers: FakeHeaders = field(default_factory=lambda: FakeHeaders([("x-a", "1"), ("x-a", "2")]))
    proto: str = "http"
    http_version: str = "1.1"
    method: str = "POST"
    scheme: str = "http"
    path: str = "/v1/keys/a b"
    query_string: str = "count=3&x=%20"
    client: str = "127.0.0.1:40000"
    server: str = "[::1]:8080"


@dataclass
class FakeTransport:
    sent: list[bytes] = field(default_factory=list)

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)


class FakeProtocol:
    """Records what the app answered; ``chunks`` is the request body as received."""

    def __init__(self, chunks: Iterable[bytes] = ()) -> None:
        self.chunks = list(chunks)
        self.answers: list[tuple[str, int, list[tuple[str, str]], bytes]] = []
        self.stream: FakeTransport | None = None
        self.hung_up = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._body()

    async def _body(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def client_disconnect(self) -> None:
        await self.hung_up.wait()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.answers.append(("bytes", status, headers, body))

    def response_empty(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.answers.append(("empty", status, headers, b""))

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> FakeTransport:
        self.answers.append(("stream", status, headers, b""))
        self.stream = FakeTransport()
        return self.stream


async def serve(app: Any, protocol: FakeProtocol, scope: FakeScope | None = None) -> None:
    rsgi_scope = cast(RsgiScope, scope or FakeScope())
    await serve_asgi(app, rsgi_scope, cast(HTTPProtocol, protocol), {"k": "v"})


def test_the_asgi_scope_carries_the_request() -> None:
    scope = asgi_scope(cast(RsgiScope, FakeScope()), {"k": "v"})
    assert scope["type"] == "http" and scope["method"] == "POST"
    assert scope["path"] == "/v1/keys/a b" and scope["query_string"] == b"count=3&x=%20"
    assert scope["headers"] == [(b"x-a", b"1"), (b"x-a", b"2")]  # repeats kept, in order
    assert scope["client"] == ("127.0.0.1", 40000)
    assert scope["server"] == ("::1", 8080)
    assert scope["state"] == {"k": "v"}


def test_a_header_value_outside_latin1_is_kept_as_utf8() -> None:
    scope = asgi_scope(cast(RsgiScope, FakeScope(headers=FakeHeaders([("x-n", "é€")]))), {})
    assert scope["headers"] == [(b"x-n", "é€".encode())]


async def test_the_body_arrives_chunk_by_chunk_then_the_hang_up() -> None:
    protocol = FakeProtocol([b"ab", b"cd"])
    messages: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for _ in range(3):
            messages.append(await receive())
        watch = asyncio.ensure_future(receive())
        await asyncio.sleep(0)
        assert not watch.done()  # nothing more to read: only a hang-up can come
        protocol.hung_up.set()
        messages.append(await watch)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    await serve(app, protocol)
    assert [m.get("body") for m in messages[:3]] == [b"ab", b"cd", b""]
    assert [m.get("more_body") for m in messages[:3]] == [True, True, False]
    assert messages[3] == {"type": "http.disconnect"}


async def test_an_answer_in_one_message_goes_out_whole() -> None:
    protocol = FakeProtocol()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"set-cookie", b"a=1")]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    await serve(app, protocol)
    assert protocol.answers == [
        ("bytes", 201, [("content-type", "application/json"), ("set-cookie", "a=1")], b"{}")
    ]


async def test_an_answer_in_several_messages_is_streamed() -> None:
    protocol = FakeProtocol()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    await serve(app, protocol)
    assert [(kind, status) for kind, status, _, _ in protocol.answers] == [("stream", 200)]
    assert protocol.stream is not None and protocol.stream.sent == [b"a", b"b"]


async def test_an_app_that_fails_before_answering_gets_an_empty_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    protocol = FakeProtocol()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    await serve(app, protocol)
    assert protocol.answers == [("empty", 500, [], b"")]
    assert "request_crashed" in caplog.text


async def test_an_app_that_fails_after_answering_is_not_answered_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    protocol = FakeProtocol()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"x"})
        raise RuntimeError("re-raised after the error page, as Starlette does")

    await serve(app, protocol)
    assert protocol.answers == [("bytes", 500, [], b"x")]
    assert "request_crashed" in caplog.text


async def test_an_app_that_returns_without_answering_gets_an_empty_500() -> None:
    protocol = FakeProtocol()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        return None

    await serve(app, protocol)
    assert protocol.answers == [("empty", 500, [], b"")]


class StubSource:
    """A type's source whose ``one`` answers with ``outcome``."""

    def __init__(self, outcome: str | Exception) -> None:
        self.name = "farmer"
        self.at_hand = True
        self.outcome = outcome

    def ready(self) -> None:
        return None

    async def one(self, client: str) -> str:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    async def take(self, count: int, client: str, once: str | None) -> Popped:
        raise AssertionError("not asked")


def stub_single(outcome: str | Exception) -> SingleId:
    metrics = DispenserMetrics(CollectorRegistry())
    return SingleId(
        {"farmer": StubSource(outcome)}, Gate(AuthConfig()), metrics, lambda n: Unknown(n, ())
    )


async def allocate_one(outcome: str | Exception, path: str = "/v1/idgenerator/farmer/id") -> Any:
    fast_path = FastPath(Starlette())
    fast_path.serve(stub_single(outcome))
    protocol = FakeProtocol()
    scope = FakeScope(path=path, headers=FakeHeaders([("x-request-id", "req-1")]))
    await fast_path.__rsgi__(cast(RsgiScope, scope), cast(HTTPProtocol, protocol))
    [(kind, status, headers, body)] = protocol.answers
    assert kind == "bytes"  # answered whole, once
    return status, dict(headers), json.loads(body) if body else None


async def test_the_fast_path_answers_one_id_over_rsgi() -> None:
    status, headers, body = await allocate_one("3029384756")
    assert (status, headers["content-type"]) == (200, "application/json")
    assert body["response"]["id"] == "3029384756"


async def test_a_refusal_on_the_fast_path_is_the_envelope_with_its_request_id() -> None:
    status, headers, body = await allocate_one(PoolEmpty("farmer", retry_after_s=3))
    assert status == 503 and headers["retry-after"] == "3"
    assert body["errors"][0]["errorCode"] == "IDG-001"
    assert headers["x-request-id"] == "req-1"


async def test_a_crash_on_the_fast_path_is_a_500_envelope_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    status, headers, body = await allocate_one(RuntimeError("boom"))
    assert status == 500 and body["errors"][0]["errorCode"] == codes.INTERNAL_ERROR.code
    assert headers["x-request-id"] == "req-1"
    assert "request_crashed" in caplog.text and "boom" in caplog.text


def test_granians_protocol_object_has_every_method_this_app_calls() -> None:
    """dispenser.rsgi types granian's untyped RSGIHTTPProtocol with a Protocol of its
    own: this fails, naming the method, when granian drops or renames one."""
    from granian import rsgi as granian_rsgi

    granian_protocol = granian_rsgi.HTTPProtocol  # type: ignore[attr-defined]

    from dispenser.rsgi import HTTPProtocol

    used = [name for name in vars(HTTPProtocol) if not name.startswith("_") or name == "__aiter__"]
    assert {"__aiter__", "response_bytes", "response_empty", "client_disconnect"} <= set(used)
    for name in used:
        assert callable(getattr(granian_protocol, name, None)), name


class StockedSource(StubSource):
    """A source with keys at hand: ``ready`` hands them out, ``one`` is never needed."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(AssertionError("waited although a key was at hand"))
        self.keys = keys
        self.asked = 0

    def ready(self) -> str | None:  # type: ignore[override]
        self.asked += 1
        return self.keys.pop(0) if self.keys else None


async def test_a_key_at_hand_is_answered_on_the_path_the_fast_path_keeps_and_forgets() -> None:
    """The first request of a path finds its answer at hand through the decision and the
    fast path keeps it for the path; a new service (or none) forgets it."""
    source = StockedSource(["3029384756", "3029384757"])
    metrics = DispenserMetrics(CollectorRegistry())
    single = SingleId({"farmer": source}, Gate(AuthConfig()), metrics, lambda n: Unknown(n, ()))
    fast_path = FastPath(Starlette())
    fast_path.serve(single)
    bodies = []
    for _ in range(2):
        protocol = FakeProtocol()
        scope = FakeScope(path="/v1/idgenerator/farmer/id", headers=FakeHeaders([]))
        await fast_path.__rsgi__(cast(RsgiScope, scope), cast(HTTPProtocol, protocol))
        [(_, status, _, body)] = protocol.answers
        assert status == 200
        bodies.append(json.loads(body)["response"]["id"])
    assert bodies == ["3029384756", "3029384757"] and source.asked == 2
    assert fast_path._at_hand  # kept for the path
    fast_path.serve(None)
    assert not fast_path._at_hand  # no answer outlives its service

"""What the sync and async clients share: requests, answers, errors, delays.

Pure: no I/O here. Each answer of the dispenser is turned into one ``Outcome``: keys,
wait and ask again (the same request, the same Idempotency-Key), or stop for good.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

# Seconds waited before asking again after a failure that carried no Retry-After.
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 2.0
# A Retry-After the client will not wait beyond (the dispenser caps its own at 60 s).
MAX_RETRY_AFTER_S = 300.0
WAIT_STATUSES = frozenset({429, 503})
# On a 422 for a count above the API key's burst, the dispenser names the largest count
# that can pass; httpx's headers are case-insensitive, a plain mapping's need lower case.
MAX_COUNT_HEADER = "kd-max-count"


class ClientError(Exception):
    """The root of every error the client raises."""


class KeyspaceExhausted(ClientError):
    """410 IDG-002: every key of the type has been dispensed; raised once the local
    buffer is drained."""


class RequestRefused(ClientError):
    """An answer that asking again cannot change (401, 403, 404, 409, 422, ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class KeysUnavailable(ClientError):
    """No key arrived before the caller's deadline (the pool was empty, or the
    dispenser could not be reached); ``cause`` is the last reason seen."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(f"{message} ({cause})" if cause else message)
        self.cause = cause


@dataclass(frozen=True)
class Keys:
    keys: list[str]
    replayed: bool = False  # the answer to an earlier attempt of the same request


@dataclass(frozen=True)
class Wait:
    seconds: float
    reason: str
    from_server: bool = False  # the delay is the server's Retry-After


@dataclass(frozen=True)
class Stop:
    error: ClientError


@dataclass(frozen=True)
class Shrink:
    """The batch asked for is above what the API key may take at once (its burst): ask
    again for at most ``limit`` keys a request."""

    limit: int


Outcome = Keys | Wait | Stop


@dataclass(frozen=True)
class Buffering:
    """How a client buffers: ``batch`` keys per request; a refill starts when fewer than
    ``low`` keys are buffered and runs until ``high`` are, with ``fetchers`` requests in
    flight at most. The defaults make a double buffer: one batch being taken, the next
    one fetched meanwhile (Leaf's segments)."""

    batch: int = 1000
    low: int = 0  # 0: one batch
    high: int = 0  # 0: low + one batch
    fetchers: int = 1

    def __post_init__(self) -> None:
        # Its upper bound is the dispenser's (dispenser.max_batch): it refuses a larger
        # batch with 422 IDG-004, which the client raises as RequestRefused. Above the
        # API key's burst, the client lowers its batch once to what the dispenser names.
        if self.batch < 1:
            raise ValueError(f"batch must be at least 1, got {self.batch}")
        if not 1 <= self.fetchers <= 16:
            raise ValueError(f"fetchers must be 1..16, got {self.fetchers}")
        if self.low < 0 or (self.high and self.high <= self.mark_low):
            raise ValueError("buffer marks: need 0 <= low < high")

    @property
    def mark_low(self) -> int:
        return self.low or self.batch

    @property
    def mark_high(self) -> int:
        return self.high or self.mark_low + self.batch


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def fetch_path(id_type: str) -> str:
    return f"/v1/keys/{id_type}"


def used_path(id_type: str) -> str:
    return f"/v1/keys/{id_type}/used"


def used_body(keys: list[str]) -> bytes:
    return json.dumps({"keys": keys}).encode()


def new_idempotency_key() -> str:
    return uuid.uuid4().hex


def fresh(headers: dict[str, str]) -> dict[str, str]:
    """A new Idempotency-Key where ``headers`` had one (a new request: its count changed)."""
    return {"Idempotency-Key": new_idempotency_key()} if headers else {}


def shrunk(buffering: Buffering, limit: int) -> Buffering | None:
    """``buffering`` with batches of at most ``limit`` keys (the marks, when left to
    their defaults, follow); None when its batch is not above ``limit`` already."""
    if buffering.batch <= limit:
        return None
    low = min(buffering.low, limit) if buffering.low else 0
    high = buffering.high if buffering.high > (low or limit) else 0
    return replace(buffering, batch=limit, low=low, high=high)


def refused(outcome: Stop | Shrink) -> ClientError:
    """The error a fetcher stops with (a Shrink that could not lower the batch)."""
    if isinstance(outcome, Stop):
        return outcome.error
    message = f"count exceeds the API key's burst ({outcome.limit} keys)"
    return RequestRefused(422, "IDG-004", message)


def shrink_message(id_type: str, before: int, limit: int) -> str:
    return (
        f"{id_type}: the API key may take at most {limit} keys a request (its burst); "
        f"batches of {limit} from now on, not {before}: pass Buffering(batch={limit}) "
        "to say so, or raise the key's burst"
    )


def retry_after(raw: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds only; a date is ignored)."""
    if raw is None or not raw.strip().isdigit():
        return None
    return min(float(raw.strip()), MAX_RETRY_AFTER_S)


def _error(body: bytes) -> tuple[str, str]:
    """(errorCode, message) of an error envelope, or placeholders."""
    try:
        parsed: Any = json.loads(body)
        first = parsed["errors"][0]
        return str(first["errorCode"]), str(first["message"])
    except (ValueError, KeyError, IndexError, TypeError):
        return "", body[:200].decode(errors="replace")


@dataclass
class Backoff:
    """Delays after failures without a Retry-After: doubling, capped; reset on success."""

    delay: float = FIRST_DELAY_S
    failures: int = field(default=0)

    def next(self) -> float:
        current = self.delay
        self.delay = min(self.delay * 2, MAX_DELAY_S)
        self.failures += 1
        return current

    def reset(self) -> None:
        self.delay, self.failures = FIRST_DELAY_S, 0


def fetched(
    status: int, header: Mapping[str, str], body: bytes, backoff: Backoff
) -> Outcome | Shrink:
    """The outcome of one ``POST /v1/keys/{type}?count=n`` answer."""
    limit = header.get(MAX_COUNT_HEADER, "")
    if status == 422 and limit.isdigit() and int(limit) > 0:
        return Shrink(int(limit))
    if status == 200:
        try:
            keys = parse_keys(body)
        except (ValueError, KeyError, TypeError):
            return Wait(backoff.next(), "200 with a malformed body")
        backoff.reset()
        return Keys(keys, header.get("idempotent-replayed") == "true")
    return _failed(status, header, body, backoff)


_KEYS_HEAD, _KEYS_TAIL = b'{"keys":["', b'"]}'


def parse_keys(body: bytes) -> list[str]:
    """The keys of ``{"keys": [...]}``. The dispenser writes exactly ``{"keys":["a","b"]}``
    (keys never need escaping), which a split reads in half the time of a JSON parser;
    any other spelling (a proxy may re-encode) goes through the JSON parser."""
    if body.startswith(_KEYS_HEAD) and body.endswith(_KEYS_TAIL) and b"\\" not in body:
        return body[len(_KEYS_HEAD) : -len(_KEYS_TAIL)].decode().split('","')
    keys = json.loads(body)["keys"]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError("the keys of an answer must be a list of strings")
    return keys


def marked(status: int, header: Mapping[str, str], body: bytes, backoff: Backoff) -> Outcome:
    """The outcome of one ``POST /v1/keys/{type}/used`` answer (Keys([]) when accepted)."""
    if status == 202:
        backoff.reset()
        return Keys([])
    return _failed(status, header, body, backoff)


def _failed(status: int, header: Mapping[str, str], body: bytes, backoff: Backoff) -> Outcome:
    code, message = _error(body)
    if status == 410:
        return Stop(KeyspaceExhausted(f"410 {code}: {message}"))
    waited = retry_after(header.get("retry-after"))
    if status in WAIT_STATUSES and waited is not None:
        return Wait(max(waited, 0.0), f"{status} {code}", from_server=True)
    if status >= 500 or status in WAIT_STATUSES:
        return Wait(backoff.next(), f"{status} {code}")
    return Stop(RequestRefused(status, code, message))


def unreachable(exc: Exception, backoff: Backoff) -> Wait:
    """A request whose answer never arrived: ask again (the same Idempotency-Key)."""
    return Wait(backoff.next(), f"{type(exc).__name__}: {exc}")


def chunks(keys: list[str], size: int) -> list[list[str]]:
    return [keys[i : i + size] for i in range(0, len(keys), size)]

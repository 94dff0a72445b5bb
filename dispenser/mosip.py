"""MOSIP's kernel ID generator API (``kernel-idgenerator-service``), served from
configured ID types (``dispenser.mosip``).

- ``GET /v1/idgenerator/uin``: one UIN, popped as any other key (coalesced, fenced,
  ledgered), in MOSIP's response wrapper.
- ``PUT /v1/idgenerator/uin`` with ``{request: {uin, status}}``: ``ASSIGNED`` marks an
  issued UIN used; ``UNASSIGNED`` releases it (recorded, and never issued again unless
  the type sets ``reissue_released``, when it goes back to the cold tier once). Only an
  ISSUED UIN changes status; asking again for the status it has is answered as the
  first time. The ledger is written by keysync: a PUT waits (``ledger_wait_s``) until
  the UIN's issue is in it, appends the change to the ledger stream, and answers with
  the outcome keysync decided for it, once, when it applied it.
- ``GET /v1/idgenerator/vid``: one VID; ``videxpiry`` is checked as MOSIP checks it,
  and not kept (keydispenser never expires nor releases a VID).

Every answer on these paths is MOSIP's wrapper ``{id, version, responsetime, metadata,
response, errors}`` with MOSIP's codes, and with MOSIP's HTTP status: 200, errors
included, but for 401/403 (MOSIP's auth adapter), 413 and 429.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from dispenser import envelope
from dispenser.auth import Forbidden, Gate, HeaderLookup, RateLimited, Unauthenticated
from dispenser.codes import (
    AUTH_FAILED,
    AUTH_FORBIDDEN,
    BY_ERROR,
    UIN_INTERNAL,
    UIN_NOT_FOUND,
    UIN_NOT_ISSUED,
    UIN_QUARANTINED,
    UIN_STATUS_NOT_FOUND,
    VID_EXPIRY_EMPTY,
    VID_EXPIRY_PAST,
    VID_EXPIRY_PATTERN,
    VID_INTERNAL,
    VID_NOT_AVAILABLE,
    BodyTooLarge,
)
from dispenser.envelope import JSON, Answer
from dispenser.service import Dispenser
from shared.domain import outcomes
from shared.domain.errors import (
    FenceHalted,
    InvalidInput,
    KeydispenserError,
    KeyspaceExhausted,
    LedgerBacklogFull,
    LedgerHalted,
    PoolEmpty,
    StoreUnavailable,
)
from shared.domain.idtypes import IdType
from shared.domain.tiers import KeyStatus

log = logging.getLogger(__name__)
T = TypeVar("T")

UIN_PATH: Final = "/v1/idgenerator/uin"
VID_PATH: Final = "/v1/idgenerator/vid"
# The methods each path serves (any other is answered 405 in MOSIP's wrapper).
METHODS: Final = {UIN_PATH: ("GET", "PUT"), VID_PATH: ("GET",)}
# MOSIP's statuses of a UIN.
ISSUED, ASSIGNED, UNASSIGNED, UNUSED = "ISSUED", "ASSIGNED", "UNASSIGNED", "UNUSED"
VID_EXPIRY_PARAM: Final = "videxpiry"
VID_EXPIRY_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
WANTED: Final = {ASSIGNED: "assigned", UNASSIGNED: "released"}  # MOSIP's -> the ledger's
# The ledger's outcome of a change -> the status MOSIP reports (a released UIN that may be
# issued again is UNUSED, MOSIP's pool status; one that never will be is UNASSIGNED);
# the other outcomes (NOT_ISSUED, NOT_FOUND) are refusals.
REPORTED: Final = {
    outcomes.ASSIGNED: ASSIGNED,
    outcomes.UNASSIGNED: UNASSIGNED,
    outcomes.UNUSED: UNUSED,
}
NOT_FOUND: Final = outcomes.NOT_FOUND
# The longest a PUT waits for keysync's next confirmation before it looks again anyway.
LEDGER_POLL_MS: Final = 20
HALT_CHECK_S: Final = 0.5  # how often a waiting PUT looks whether the ledger halted


class Refused(Exception):
    """A MOSIP error answer: (HTTP status, code, message), with headers."""

    def __init__(
        self, code: tuple[str, str], status: int = 200, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(code[1])
        self.code, self.status, self.headers = code, status, headers or {}


def wrapper(
    response: Any,
    errors: list[dict[str, str]] | None,
    request_id: Any = None,
    version: Any = None,
) -> dict[str, Any]:
    """MOSIP's ResponseWrapper, field for field (nulls as MOSIP writes them)."""
    return {
        "id": request_id,
        "version": version,
        "responsetime": envelope.response_time(),
        "metadata": None,
        "response": response,
        "errors": errors,
    }


def _answer(
    content: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Answer:
    body = json.dumps(content, separators=(",", ":")).encode()
    extra = [(name.lower(), value) for name, value in (headers or {}).items()]
    return status, [JSON, *extra], body


def _error(
    code: tuple[str, str],
    status: int = 200,
    headers: dict[str, str] | None = None,
    request: dict[str, Any] | None = None,
) -> Answer:
    """An error in MOSIP's wrapper; a PUT's id and version are echoed, as MOSIP does."""
    ident, version = (request or {}).get("id"), (request or {}).get("version")
    errors = [{"errorCode": code[0], "message": code[1]}]
    return _answer(wrapper(None, errors, _text(ident), _text(version)), status, headers)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _refusal(
    exc: KeydispenserError, not_available: tuple[str, str], internal: tuple[str, str]
) -> Refused:
    """A domain error as MOSIP's answer on these paths."""
    if isinstance(exc, Unauthenticated):
        return Refused((AUTH_FAILED, str(exc)), 401, {"WWW-Authenticate": "Bearer"})
    if isinstance(exc, Forbidden):
        return Refused((AUTH_FORBIDDEN, str(exc)), 403)
    if isinstance(exc, RateLimited):
        limited = BY_ERROR[RateLimited]
        return Refused(
            (limited.code, str(exc)), limited.status, {"Retry-After": str(exc.retry_after_s)}
        )
    if isinstance(exc, PoolEmpty):
        return Refused(not_available, 200, {"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, KeyspaceExhausted):
        return Refused(not_available)
    if isinstance(exc, BodyTooLarge):
        return Refused((internal[0], str(exc)), 413)
    if isinstance(exc, InvalidInput):
        return Refused((internal[0], str(exc)))
    if isinstance(exc, LedgerHalted | FenceHalted):  # at once, and why: an operator must act
        return Refused((internal[0], str(exc)), 200, {"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, StoreUnavailable | LedgerBacklogFull):
        return Refused(internal, 200, {"Retry-After": "1"})
    return Refused(internal)


async def get_uin(dispenser: Dispenser, gate: Gate, name: str, headers: HeaderLookup) -> Answer:
    return await _get_one(dispenser, gate, name, headers, "uin", UIN_NOT_FOUND, UIN_INTERNAL)


async def get_vid(
    dispenser: Dispenser, gate: Gate, name: str, headers: HeaderLookup, expiry: str | None
) -> Answer:
    try:
        _check_expiry(expiry)
    except Refused as refused:
        return _error(refused.code, refused.status, refused.headers)
    vid = ("vid", VID_NOT_AVAILABLE, VID_INTERNAL)
    return await _get_one(dispenser, gate, name, headers, *vid)


def _check_expiry(raw: str | None) -> None:
    """``videxpiry`` as MOSIP checks it (its value is not kept: VIDs never expire here)."""
    if raw is None:
        return
    if not raw.strip():
        raise Refused(VID_EXPIRY_EMPTY)
    try:
        expiry = datetime.strptime(raw, VID_EXPIRY_FORMAT).replace(tzinfo=UTC)
    except ValueError as exc:
        raise Refused(VID_EXPIRY_PATTERN) from exc
    if expiry < datetime.now(UTC):
        raise Refused(VID_EXPIRY_PAST)


async def _get_one(
    dispenser: Dispenser,
    gate: Gate,
    name: str,
    headers: HeaderLookup,
    field: str,
    not_available: tuple[str, str],
    internal: tuple[str, str],
) -> Answer:
    try:
        source = dispenser.source(name)
        client = gate.admit(headers, name)
        key = await source.one(client)
        result = _answer(wrapper({field: key}, None))
    except KeydispenserError as exc:
        refused = _refusal(exc, not_available, internal)
        dispenser.metrics.errors.labels(refused.code[0]).inc()
        result = _error(refused.code, refused.status, refused.headers)
    except Exception:
        log.exception("request_crashed", extra={"path": f"/v1/idgenerator/{field}"})
        dispenser.metrics.errors.labels(internal[0]).inc()
        result = _error(internal)
    return result


async def put_uin(
    dispenser: Dispenser, gate: Gate, name: str, headers: HeaderLookup, raw: bytes
) -> Answer:
    """A status change of an issued UIN, answered when the ledger shows its outcome."""
    request: dict[str, Any] = {}
    try:
        request = _parsed(raw)
        client, admin = gate.admit_with_rights(headers, name)
        given, status = _uin_and_status(request)
        uin, final = await _change(dispenser, name, given, status, client, admin)
    except Refused as refused:
        return _error(refused.code, refused.status, refused.headers, request)
    except KeydispenserError as exc:
        mapped = _refusal(exc, UIN_NOT_FOUND, UIN_INTERNAL)
        dispenser.metrics.errors.labels(mapped.code[0]).inc()
        return _error(mapped.code, mapped.status, mapped.headers, request)
    except Exception:
        log.exception("request_crashed", extra={"path": UIN_PATH})
        return _error(UIN_INTERNAL, request=request)
    response = {"uin": uin, "status": final}
    return _answer(wrapper(response, None, _text(request.get("id")), _text(request.get("version"))))


def body_refused(exc: KeydispenserError) -> Answer:
    """A PUT body refused before it was read whole (over ``max_body_bytes``)."""
    mapped = _refusal(exc, UIN_NOT_FOUND, UIN_INTERNAL)
    return _error(mapped.code, mapped.status, mapped.headers)


def method_not_allowed(allowed: str) -> Answer:
    return _error(
        (UIN_INTERNAL[0], f"method not allowed here (allowed: {allowed})"), 405, {"Allow": allowed}
    )


def _parsed(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Refused((UIN_INTERNAL[0], "request body is not JSON")) from exc
    if not isinstance(body, dict):
        raise Refused((UIN_INTERNAL[0], "request body must be a JSON object"))
    return body


def _uin_and_status(request: dict[str, Any]) -> tuple[str, Any]:
    inner = request.get("request")
    if not isinstance(inner, dict) or not isinstance(inner.get("uin"), str):
        raise Refused((UIN_INTERNAL[0], "request.uin is missing"))
    return inner["uin"], inner.get("status")


async def _change(
    dispenser: Dispenser, name: str, given: str, status: Any, client: str, admin: bool
) -> tuple[str, str]:
    """Applies ``status`` to the UIN ``given`` names, through the ledger; returns the
    UIN as the ledger holds it and the status MOSIP reports after the change.

    keysync decides the change once, in the ledger transaction that applies it, and
    publishes the outcome; this answers with that outcome (docs/reliability.md, "The
    ledger's one history"), never with a reading of the ledger made apart from it."""
    id_type = dispenser.ledger_type(name)
    if not id_type.validate(given):
        raise Refused(UIN_NOT_FOUND)
    uin = id_type.normalise(given)
    wanted = WANTED.get(status) if isinstance(status, str) else None
    deadline = time.monotonic() + _wait_s(dispenser)
    await _refuse_if_halted(dispenser, name)  # at once: a halted ledger applies nothing
    newest = await dispenser.ledger_stream.newest_entry(name)
    await _caught_up(dispenser, name, newest, deadline)
    if wanted is None:
        raise Refused(await _no_such_status(dispenser, name, uin, client, admin))
    await dispenser.ledger_open(id_type)
    if wanted == "assigned":
        entry = await dispenser.ledger_stream.record_used(name, [uin], client, admin, reply=True)
    else:
        # The Idempotency-Key it was issued under is forgotten with the release: a
        # retry of that request never gets back a key given back.
        found = _visible(await dispenser.ledger.status(name, uin), client, admin)
        held = found.idempotency_key if found.state == "issued" else None
        forget = [(found.client, held)] if held and found.client else []
        entry = await dispenser.ledger_stream.record_released(
            name, [uin], client, admin, forget, reply=True
        )
    outcome = await _outcome(dispenser, name, entry, deadline)
    await _durable(dispenser, id_type)
    if outcome in REPORTED:
        return uin, REPORTED[outcome]
    if outcome == outcomes.QUARANTINED:
        raise Refused(UIN_QUARANTINED)
    raise Refused(UIN_NOT_FOUND if outcome == NOT_FOUND else UIN_NOT_ISSUED)


async def _no_such_status(
    dispenser: Dispenser, name: str, uin: str, client: str, admin: bool
) -> tuple[str, str]:
    """MOSIP's refusal of a status it does not know, by what the UIN is now: not found,
    not ISSUED, or the status itself."""
    found = _visible(await dispenser.ledger.status(name, uin), client, admin)
    if found.state == "unknown":
        return UIN_NOT_FOUND
    if found.state != "issued":
        return UIN_NOT_ISSUED
    return UIN_STATUS_NOT_FOUND


async def _outcome(dispenser: Dispenser, name: str, entry: str, deadline: float) -> str:
    """The outcome keysync decided for the change ``entry``, once published."""

    async def published() -> str | None:
        return await dispenser.ledger_stream.outcome(name, entry)

    return await _waited(dispenser, name, published, entry, deadline)


async def _waited(
    dispenser: Dispenser,
    name: str,
    probe: Callable[[], Awaitable[T | None]],
    entry: str,
    deadline: float,
) -> T:
    """What ``probe`` answers once it answers (not None), looked at again as soon as
    keysync confirms a ledger transaction (``wait_confirmed``: woken by the
    confirmation, not a poll) and at least every LEDGER_POLL_MS (a wake-up missed, on a
    Redis failover, costs that much), until ``deadline``: then the ledger is behind
    keysync (503-like, Retry-After). A ledger halted meanwhile is said at once (looked
    at every HALT_CHECK_S)."""
    stream = dispenser.ledger_stream
    mark = await stream.confirmed_mark(name)  # before the look: nothing after it missed
    checked = time.monotonic()
    while (found := await probe()) is None:
        now = time.monotonic()
        if now >= deadline or now - checked >= HALT_CHECK_S:
            await _refuse_if_halted(dispenser, name)
            checked = now
        if now >= deadline:
            log.warning("mosip_ledger_behind", extra={"entry": entry})
            raise Refused(
                (UIN_INTERNAL[0], "the ledger is behind (is keysync running?); retry later"),
                200,
                {"Retry-After": "1"},
            )
        mark = await stream.wait_confirmed(name, mark, LEDGER_POLL_MS)
    return found


async def _durable(dispenser: Dispenser, id_type: IdType) -> None:
    """For a type whose ledger_durability is not async: return once the change's entry,
    its outcome and the link that decided it (all written before this call) are on the
    replicas (on disk, fsynced) as the type asks, else refuse (Retry-After: asked
    again, the outcome decided is answered as the first time). A WAIT covers every
    write the server replicated before it, whichever connection made it."""
    config = id_type.config
    if config.ledger_durability == "async":
        return
    try:
        durable = await dispenser.ledger_stream.wait_durable(
            id_type.name, config.ledger_durability, config.ledger_replicas, config.ledger_wait_ms
        )
    except StoreUnavailable:
        durable = False
    if not durable:
        log.warning("mosip_change_unconfirmed", extra={"id_type": id_type.name})
        raise Refused(
            (
                UIN_INTERNAL[0],
                f"the change is not {config.ledger_durability} on {config.ledger_replicas} "
                "replica(s) yet; retry later (it is answered as decided)",
            ),
            200,
            {"Retry-After": "1"},
        )


async def _refuse_if_halted(dispenser: Dispenser, name: str) -> None:
    """LedgerHalted while the type's ledger is halted: nothing is applied to it until an
    operator resumes it, so waiting for keysync would only end in "behind"."""
    reason = await dispenser.ledger.halted(name)
    if reason:
        raise LedgerHalted(reason)


def _visible(found: KeyStatus, client: str, admin: bool) -> KeyStatus:
    """A key issued to another client is, to a client without ledger permission, a key
    never issued (as for ``GET /v1/keys/{type}/{key}``)."""
    if found.state != "unknown" and found.client != client and not admin:
        return KeyStatus("unknown")
    return found


def _wait_s(dispenser: Dispenser) -> float:
    mosip = dispenser.settings.dispenser.mosip
    return mosip.ledger_wait_s if mosip is not None else 5.0


async def _caught_up(dispenser: Dispenser, name: str, entry: str | None, deadline: float) -> None:
    """Wait until keysync has applied every ledger entry up to ``entry`` (of the stream
    that holds type ``name``'s entries)."""
    if entry is None:
        return

    async def applied() -> bool | None:
        return True if await dispenser.ledger_stream.applied(name, entry) else None

    await _waited(dispenser, name, applied, entry, deadline)

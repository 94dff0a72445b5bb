"""Every error code the dispenser answers with, in one table: this is the only place a
code, its HTTP status and its meaning are written.

``CODES``: the service's own codes (OpenG2P's envelope, ``IDG-...``): the HTTP status,
what the code means, the errors answered with it, and whether ``Retry-After`` comes
with it. ``MOSIP``: MOSIP's kernel ID generator's codes with MOSIP's own texts, field
for field, and what each means here. The OpenAPI document's error texts are built from
both; docs/api.md's table is checked against ``CODES`` (tests/unit/test_error_codes.py);
``envelope`` maps errors to codes, and ``mosip`` answers with MOSIP's, from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

from dispenser.auth import Forbidden, RateLimited, Unauthenticated
from shared.domain.errors import (
    ClockBehind,
    FenceHalted,
    InvalidInput,
    KeydispenserError,
    KeyspaceExhausted,
    LedgerBacklogFull,
    LedgerDisabled,
    LedgerHalted,
    MachineIdUnavailable,
    PoolEmpty,
    StoreUnavailable,
    UnknownIdType,
)


class BodyTooLarge(KeydispenserError):
    """A request body over ``dispenser.max_body_bytes`` (413); refused before it is read."""


class ClientGone(KeydispenserError):
    """The client disconnected before its request was read whole; nothing is answered."""


@dataclass(frozen=True)
class ErrorCode:
    code: str
    status: int
    meaning: str  # the OpenAPI document's text; docs/api.md says more
    raised_by: tuple[type[KeydispenserError], ...] = ()
    retry_after: bool = False  # the answer says when to ask again


CODES: Final = (
    ErrorCode("IDG-001", 503, "no key available right now", (PoolEmpty,), True),
    ErrorCode("IDG-002", 410, "keyspace exhausted", (KeyspaceExhausted,)),
    ErrorCode("IDG-003", 404, "unknown id_type", (UnknownIdType,)),
    ErrorCode("IDG-004", 422, "malformed input", (InvalidInput,)),
    ErrorCode("IDG-005", 503, "a store is unreachable", (StoreUnavailable,), True),
    ErrorCode("IDG-006", 404, "no such route"),
    ErrorCode("IDG-007", 405, "method not allowed on this route"),
    ErrorCode(
        "IDG-008",
        401,
        "missing or unknown API key (only when API keys are configured)",
        (Unauthenticated,),
    ),
    ErrorCode("IDG-009", 403, "this API key may not use the id_type", (Forbidden,)),
    ErrorCode("IDG-010", 429, "rate limit exceeded; see Retry-After", (RateLimited,), True),
    ErrorCode("IDG-011", 409, "the id_type keeps no ledger", (LedgerDisabled,)),
    ErrorCode("IDG-012", 413, "request body over dispenser.max_body_bytes", (BodyTooLarge,)),
    ErrorCode("IDG-013", 400, "the client disconnected while sending its body", (ClientGone,)),
    ErrorCode("IDG-014", 503, "the type's ledger is behind", (LedgerBacklogFull,), True),
    ErrorCode(
        "IDG-015", 503, "the clock is behind the last snowflake time issued", (ClockBehind,), True
    ),
    ErrorCode(
        "IDG-016",
        503,
        "no machine-ID lease held for the snowflake type right now",
        (MachineIdUnavailable,),
        True,
    ),
    ErrorCode(
        "IDG-017",
        503,
        "halted: ledger history lost (the message says why; an operator must resume it)",
        (LedgerHalted,),
        True,
    ),
    ErrorCode(
        "IDG-019",
        503,
        "halted: Redis and PostgreSQL both lost state; an operator must run the fence by "
        "hand (the message says how)",
        (FenceHalted,),
        True,
    ),
    ErrorCode(
        "IDG-018",
        409,
        "the key is quarantined (a ledger history lost and accepted): never given back",
    ),
    ErrorCode("IDG-500", 500, "internal error"),
)
BY_CODE: Final = {entry.code: entry for entry in CODES}
# An error answered: the first entry naming its class or a base of it (a subclass of
# InvalidInput is IDG-004). Anything else is a crash: IDG-500.
BY_ERROR: Final = {kind: entry for entry in CODES for kind in entry.raised_by}
POOL_EMPTY: Final = BY_CODE["IDG-001"]  # a 503 that is no server fault: never logged
ROUTE_NOT_FOUND: Final = BY_CODE["IDG-006"]
METHOD_NOT_ALLOWED: Final = BY_CODE["IDG-007"]
INTERNAL_ERROR: Final = BY_CODE["IDG-500"]
# OpenG2P's health route: 503 IDG-005 until start-up is complete, IDG-006 when its
# store check fails afterwards (IDG-006 is also this service's 404, as OpenG2P's).
HEALTH_STARTING: Final = "IDG-005"
HEALTH_STORE_FAILED: Final = "IDG-006"
# What a client is told of a server-side failure; the detail goes to the log only.
PUBLIC_MESSAGES: Final = {
    "IDG-005": "a store is unavailable; retry later",
    "IDG-500": "internal error",
}


def code_of(error: KeydispenserError) -> ErrorCode:
    """The code ``error`` is answered with (IDG-500 for none)."""
    return next(
        (entry for kind, entry in BY_ERROR.items() if isinstance(error, kind)), INTERNAL_ERROR
    )


def described(status: int) -> str:
    """What an error answer of ``status`` means, every code it may carry (OpenAPI)."""
    return "; ".join(f"{c.code}: {c.meaning}" for c in CODES if c.status == status)


class MosipCode(NamedTuple):
    """One of MOSIP's error codes: the code and MOSIP's own message, as its kernel ID
    generator writes them."""

    code: str
    message: str


# MOSIP's codes (UinGeneratorErrorCode, VIDGeneratorErrorCode, the auth adapter's).
UIN_NOT_FOUND: Final = MosipCode("KER-UIG-001", "UIN could not be found")
UIN_STATUS_NOT_FOUND: Final = MosipCode("KER-UIG-003", "Given UIN status not found")
UIN_NOT_ISSUED: Final = MosipCode("KER-UIG-004", "Given UIN is not in ISSUED status")
UIN_INTERNAL: Final = MosipCode("KER-UIG-005", "Internal Server Error")
# Not MOSIP's: a release of a UIN ``ledger-resume --accept-loss`` quarantined (HTTP 200
# in MOSIP's wrapper, as MOSIP answers its own refusals; IDG-018 in CODES).
UIN_QUARANTINED: Final = (
    BY_CODE["IDG-018"].code,
    "UIN quarantined: an operator accepted a lost ledger history that may have changed "
    "it (ledger-resume --accept-loss); it is never given back nor issued again "
    '(runbook: docs/operations.md, "KdLedgerHalted")',
)
VID_NOT_AVAILABLE: Final = MosipCode("KER-VID-001", "VID not available for allocation")
VID_EXPIRY_EMPTY: Final = MosipCode("KER-VID-002", "Vid expiry date is empty")
VID_EXPIRY_PAST: Final = MosipCode("KER-VID-003", "Vid expiry date is before current utc time")
VID_EXPIRY_PATTERN: Final = MosipCode(
    "KER-VID-004",
    "Vid expiry date pattern is invalid, should be in yyyy-MM-dd'T'HH:mm:ss.SSS'Z' pattern",
)
VID_INTERNAL: Final = MosipCode("KER-VID-005", "Internal Server Error")
AUTH_FAILED: Final = "KER-ATH-401"
AUTH_FORBIDDEN: Final = "KER-ATH-403"
# What a MOSIP route answers besides 200 (MOSIP answers its own errors with 200), for
# the OpenAPI document: the status, the code and what it means here.
MOSIP_STATUSES: Final = {
    401: f"{AUTH_FAILED}: no valid token or API key",
    403: f"{AUTH_FORBIDDEN}: the client may not use this id type",
    413: f"{UIN_INTERNAL.code}: request body over dispenser.max_body_bytes",
    429: f"{BY_ERROR[RateLimited].code}: {BY_ERROR[RateLimited].meaning}",
}

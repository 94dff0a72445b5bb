"""Every answer to "one ID" (``POST /v1/idgenerator/{id_type}/id``), decided here.

``SingleId.answer`` takes the path's type segment and the request's headers and gives
the whole answer (status, headers, body): the API-key check, the Idempotency-Key, the
key itself from the type's source (``dispenser.sources``: prefetched, minted or popped),
the envelope, the error answers, the latency and error metrics. The request flows one
way: route, this decision, the type's source, the store. It does no I/O of its own
beyond the source's, so a unit test drives it without a server. Three adapters carry
its answer, a few lines each: over RSGI and over ASGI in ``dispenser.fastpath`` (before
Starlette's stack), and the Starlette route in ``dispenser.routes`` (for a path the
fast path leaves to the router).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Final

from dispenser import envelope
from dispenser.auth import Gate, HeaderLookup
from dispenser.envelope import JSON, Answer, ok_id
from dispenser.metrics import DispenserMetrics
from dispenser.sources import Source
from shared.domain.errors import InvalidInput, KeydispenserError
from shared.domain.names import ALIAS

ALLOCATE_ONE: Final = "/v1/idgenerator/{id_type}/id"
_OK: Final = [JSON]
_REPLAYED: Final = [JSON, ("idempotent-replayed", "true")]
# An answer at hand for one path's requests, from their headers (None: not at hand).
AtHand = Callable[[HeaderLookup], Answer | None]


def path_pattern(template: str, name: re.Pattern[str]) -> re.Pattern[str]:
    """The paths ``template`` stands for, its ``{id_type}`` a group ``name`` matches.

    Anchored with \\A and \\Z: a $ would also let a path through with a newline after it.
    """
    placeholder = re.escape("{id_type}")
    escaped = re.escape(template)
    if escaped.count(placeholder) != 1:
        raise ValueError(f"route template {template!r} must hold {{id_type}} once")
    group = f"(?P<name>{_unanchored(name)})"
    return re.compile(r"\A" + escaped.replace(placeholder, group) + r"\Z")


def _unanchored(pattern: re.Pattern[str]) -> str:
    """The body of a ^...$ pattern (ID_TYPE_NAME is anchored: it is also an OpenAPI pattern)."""
    text = pattern.pattern
    if not (text.startswith("^") and text.endswith("$")):
        raise ValueError(f"expected a pattern anchored with ^ and $, got {text!r}")
    return text[1:-1]


# Every well-formed type segment (ALIAS admits every type name too).
ALLOCATE_ONE_PATH: Final = path_pattern(ALLOCATE_ONE, ALIAS)


def idempotency_key(headers: HeaderLookup) -> str | None:
    """The Idempotency-Key header: 1..255 visible ASCII characters, or absent."""
    raw = headers.get("idempotency-key")
    return None if raw is None else checked_idempotency_key(raw)


def checked_idempotency_key(raw: str) -> str:
    """``raw`` when it is an Idempotency-Key (1..255 visible ASCII characters)."""
    if not 1 <= len(raw) <= 255 or not all(33 <= ord(c) <= 126 for c in raw):
        raise InvalidInput("Idempotency-Key must be 1..255 visible ASCII characters")
    return str(raw)


class SingleId:
    """The single-ID route's decision: the type a path segment names (resolved once, at
    start-up, to its source), the API-key gate, the key from the type's source.

    ``at_hand_of`` gives a path's answer without waiting when it can (a key of the stock
    or a snowflake ID minted now, for a service open to anonymous callers), with no
    coroutine;
    ``answer`` is the whole of it, awaited when a key must be waited for, an API key or
    token checked, or an Idempotency-Key looked up."""

    def __init__(
        self,
        sources: Mapping[str, Source],
        gate: Gate,
        metrics: DispenserMetrics,
        unknown: Callable[[str], Source],
    ) -> None:
        """``sources``: each path segment that names a served type (its name and its
        aliases) -> the type's source; ``unknown(segment)``: the source of any other
        segment, which refuses it (after the API-key check: a caller without a key is
        not told which names exist)."""
        self._sources = dict(sources)
        self._gate = gate
        self._open = not gate.enabled  # no API keys, no tokens: every caller is anonymous
        self._metrics = metrics
        self._timed = metrics.latency.of(ALLOCATE_ONE)
        self._unknown = unknown

    def at_hand_of(self, segment: str) -> AtHand | None:
        """The answer at hand for one path segment's requests, from their headers (None
        when a key is not at hand for an anonymous caller: ``answer`` gives it); its source
        looked up once, the fast path keeps it per path. None when no answer is ever at
        hand for the segment (it names no served type, its type keeps no stock, or the
        gate checks every caller)."""
        source = self._sources.get(segment)
        if source is None or not self._open or not source.at_hand:
            return None
        ready, timed, metrics, path = source.ready, self._timed, self._metrics, _path(segment)

        def at_hand(headers: HeaderLookup) -> Answer | None:
            started = perf_counter()
            if headers.get("idempotency-key") is not None:
                return None  # its retry is answered with the same key: ``answer`` looks
            try:
                key = ready()
            except KeydispenserError as exc:  # a snowflake type without its lease
                result = envelope.refusal(exc, headers, metrics, path)
            except Exception:
                result = envelope.crashed(headers, path)
            else:
                if key is None:
                    return None
                result = (200, _OK, ok_id(key))
            timed(perf_counter() - started)
            return result

        return at_hand

    async def answer(self, segment: str, headers: HeaderLookup) -> Answer:
        """The answer to a request for one ID of the type ``segment`` names (its name or
        an alias). Never raises: a refusal or a crash is an error answer, logged and
        counted."""
        started = perf_counter()
        try:
            source = self._sources.get(segment)
            if source is None:
                source = self._unknown(segment)
            client = self._gate.admit(headers, source.name)
            once = headers.get("idempotency-key")
            if once is None:
                key = source.ready()  # at hand: answered without waiting
                if key is None:
                    key = await source.one(client)
                result: Answer = (200, _OK, ok_id(key))
            else:
                once = checked_idempotency_key(once)
                popped = await source.take(1, client, once)
                result = (200, _REPLAYED if popped.replayed else _OK, ok_id(popped.keys[0]))
        except KeydispenserError as exc:
            result = envelope.refusal(exc, headers, self._metrics, _path(segment))
        except Exception:
            result = envelope.crashed(headers, _path(segment))
        self._timed(perf_counter() - started)
        return result


def _path(segment: str) -> str:
    return ALLOCATE_ONE.replace("{id_type}", segment)

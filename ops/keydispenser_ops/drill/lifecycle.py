"""The UIN lifecycle under the drill's faults, as MOSIP's registries drive it: clients
(each an API client of its own) take UINs (MOSIP's GET, OpenG2P's POST with an
Idempotency-Key), retry some of those requests, and mark each UIN ASSIGNED or
UNASSIGNED (MOSIP's PUT); released UINs go back to the pool after a short while and
are issued again, to any client.

Everything a client was told is recorded, with times; ``check`` judges it against the
ledger PostgreSQL holds at the end (after Jepsen's checkers: the whole history, every
acknowledged answer): each UIN received is in the ledger under the client it went to,
each acknowledged status change holds, no UIN was live in two clients' hands at once,
and no retry was answered with a UIN its client had given back. The lifecycle type
runs with ``ledger_durability: replicated``: nothing is excused.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg

from dispenser import codes
from keydispenser_ops.drill.history import LossSpan
from shared.stores.postgres import sql

LIFECYCLE_TYPE = "drill_uin"
LIFECYCLE_TYPE_CONFIG: dict[str, Any] = {
    "kind": "numeric",
    "length": 10,
    # Small tiers, every counter a key: a released UIN requeued is issued again after a
    # few hundred others; the drill's quiet end (until_reissued) waits for one. (Tinier
    # tiers, beside the cluster drill's plain type on one stream, stalled the ledger
    # drains after a CLUSTER FAILOVER: an open finding, docs/reliability.md.)
    "filter_profile": "none",
    "range_size": 256,
    "hot": {"low": 10, "high": 40},
    "cold": {"low": 60, "high": 180},
    "sync_batch": 20,
    "ledger": True,
    "reissue_released": True,
    "reissue_after_s": 2,
    "ledger_durability": "replicated",
    "ledger_wait_ms": 1_000,
}


def type_config(replicas: int) -> dict[str, Any]:
    """The lifecycle type for a topology whose primaries have ``replicas`` replicas
    each: an answer waits until every one of them holds its entry. A failover may
    promote any of them, not always the most up to date (failback forces its choice
    with replica-priority): with fewer, an answer confirmed by one replica is lost when
    another is promoted (seen in the drill with 1 of 2)."""
    return LIFECYCLE_TYPE_CONFIG | {"ledger_replicas": replicas}


LIFECYCLE_CLIENTS = tuple(f"registry-{n}" for n in "abcdef")
# Faults that destroy what replicated durability covers (no persistence in the drill):
# a restart without persistence, or from an older snapshot.
REPLICA_LOSS_FAULTS = frozenset(
    {"redis_restart_empty", "redis_restart_old_snapshot", "shard_restart_empty"}
)
RETRY_EVERY = 4  # one request in this many repeats an earlier Idempotency-Key
PAIR_EVERY = 5  # one UIN taken in this many gets PUT ASSIGNED and UNASSIGNED at once
REPEAT_EVERY = 7  # one request in this many asks again an acknowledged PUT ASSIGNED
# What PUT answers when it applied each status (the status MOSIP reports after it);
# NOT_ISSUED: refused, the UIN is not ISSUED any more (the other change came first).
DONE = {"ASSIGNED": {"ASSIGNED"}, "UNASSIGNED": {"UNASSIGNED", "UNUSED"}}
NOT_ISSUED = codes.UIN_NOT_ISSUED.code
# Every answer that says what the ledger decided (a status, or a refusal: not found,
# not a status, not ISSUED); UIN_INTERNAL (the ledger behind) decides nothing.
DECIDED = frozenset(
    {
        "ASSIGNED",
        "UNASSIGNED",
        "UNUSED",
        codes.UIN_NOT_FOUND.code,
        codes.UIN_STATUS_NOT_FOUND.code,
        NOT_ISSUED,
    }
)
REISSUE_WAIT_S = 30.0  # the quiet end's longest wait for a UIN issued again
MOSIP_PUT = {"id": "mosip.kernel.uinservice", "version": "1.0", "metadata": {}}


def api_keys(names: tuple[str, ...]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Fresh API keys for ``names``: (the dispenser's configuration, name -> key)."""
    keys = {name: secrets.token_urlsafe(24) for name in names}
    config = [
        {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, key in keys.items()
    ]
    return config, keys


@dataclass(frozen=True)
class Receipt:
    key: str
    client: str
    at: float  # monotonic: when answered
    how: str  # "get", "post" or "retry" (a retry answered with a key not seen before)
    sent: float = -1.0  # when its request was sent (-1: at)


@dataclass(frozen=True)
class Change:
    key: str
    client: str
    status: str  # ASSIGNED or UNASSIGNED
    sent: float  # monotonic
    acknowledged: bool  # answered 200 with the UIN's status, no error


@dataclass(frozen=True)
class Pair:
    """PUT ASSIGNED and PUT UNASSIGNED of one UIN sent at once: the ledger decides which
    came first, once; whatever it answered must hold (the other refused)."""

    key: str
    client: str
    assigned: str  # each answer: the status reported, an error code, or "" (no answer)
    unassigned: str
    sent: float


@dataclass(frozen=True)
class Repeat:
    """An acknowledged PUT ASSIGNED asked again later: answered as the first time."""

    key: str
    client: str
    answer: str  # the status reported, or an error code ("": no answer)
    first_sent: float  # when the first (acknowledged) one was sent


@dataclass(frozen=True)
class Retry:
    client: str
    idempotency_key: str
    first: str  # the key the first request was answered with
    again: str  # the key the retry was answered with
    at: float
    replayed: bool  # answered with the first request's record (Idempotent-Replayed)
    first_at: float  # when the first request was answered


@dataclass
class LifecycleLoad:
    urls: list[str]
    keys: dict[str, str]  # client name -> API key
    max_requests: int = 1_000_000
    receipts: list[Receipt] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    retries: list[Retry] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    repeats: list[Repeat] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _reissued: asyncio.Event = field(default_factory=asyncio.Event)
    _keys_seen: set[str] = field(default_factory=set)
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    _paused: bool = False

    def stop(self) -> None:
        self._stop.set()
        self._open.set()

    def pause(self) -> None:
        """Hold every request until ``resume`` (a quiet spell of the ledger)."""
        self._paused = True
        self._open.clear()

    def resume(self) -> None:
        self._paused = False
        self._open.set()

    def _received(self, receipt: Receipt) -> None:
        if receipt.key in self._keys_seen:
            self._reissued.set()  # a UIN given back, requeued and handed out again
        self._keys_seen.add(receipt.key)
        self.receipts.append(receipt)

    async def until_reissued(self, timeout_s: float) -> None:
        """The drill's quiet end: its faults over and its other loads stopped, the
        lifecycle goes on until a UIN given back has been issued again, or
        ``timeout_s`` (on a slow machine the faults' rounds may end before one was)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._reissued.wait(), timeout_s)

    async def run(self, deadline: float) -> None:
        timeout = aiohttp.ClientTimeout(total=8)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(
                *(self._client(session, name, deadline) for name in sorted(self.keys))
            )

    async def _client(self, session: aiohttp.ClientSession, name: str, deadline: float) -> None:
        headers = {"X-API-Key": self.keys[name]}
        # (Idempotency-Key, key, when answered) of this client's POSTs
        asked: list[tuple[str, str, float]] = []
        assigned: list[Change] = []  # this client's acknowledged PUT ASSIGNED, latest
        i = 0
        if not self._paused:
            self._open.set()
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.requests >= self.max_requests:
                return
            await self._open.wait()
            self.requests += 1
            i += 1
            base = self.urls[i % len(self.urls)]
            if asked and i % RETRY_EVERY == 0:
                await self._retry(
                    session, base, name, headers, asked, len(asked) - 1 - i % len(asked)
                )
                continue
            if assigned and i % REPEAT_EVERY == 0:
                await self._repeat(session, base, name, headers, assigned[i % len(assigned)])
                continue
            key = await self._take(session, base, name, headers, i, asked)
            if key is None:
                await asyncio.sleep(0.05)
                continue
            if i % PAIR_EVERY == 0:
                await self._pair(session, base, name, headers, key)
                continue
            status = "ASSIGNED" if i % 3 else "UNASSIGNED"
            change = await self._change(session, base, name, headers, key, status)
            if change.acknowledged and status == "ASSIGNED":
                assigned.append(change)
                del assigned[:-20]

    async def _pair(
        self,
        session: aiohttp.ClientSession,
        base: str,
        name: str,
        headers: dict[str, str],
        key: str,
    ) -> None:
        """PUT ASSIGNED and PUT UNASSIGNED of ``key`` at once (each recorded as a change)."""
        sent = time.monotonic()
        assigned, unassigned = await asyncio.gather(
            self._put(session, base, headers, key, "ASSIGNED"),
            self._put(session, base, headers, key, "UNASSIGNED"),
        )
        for status, answer in (("ASSIGNED", assigned), ("UNASSIGNED", unassigned)):
            self.changes.append(Change(key, name, status, sent, answer in DONE[status]))
        self.pairs.append(Pair(key, name, assigned, unassigned, sent))

    async def _repeat(
        self,
        session: aiohttp.ClientSession,
        base: str,
        name: str,
        headers: dict[str, str],
        first: Change,
    ) -> None:
        answer = await self._put(session, base, headers, first.key, "ASSIGNED")
        self.repeats.append(Repeat(first.key, name, answer, first.sent))

    async def _take(
        self,
        session: aiohttp.ClientSession,
        base: str,
        name: str,
        headers: dict[str, str],
        i: int,
        asked: list[tuple[str, str, float]],
    ) -> str | None:
        sent = time.monotonic()
        if i % 2:
            body = await self._call(session, "GET", f"{base}/v1/idgenerator/uin", headers)
            key = _mosip_uin(body)
            how = "get"
        else:
            idempotency_key = f"{name}-{i}"
            url = f"{base}/v1/idgenerator/{LIFECYCLE_TYPE}/id"
            body = await self._call(
                session, "POST", url, headers | {"Idempotency-Key": idempotency_key}
            )
            key = _openg2p_id(body)
            how = "post"
            if key is not None:
                asked.append((idempotency_key, key, time.monotonic()))
                del asked[:-20]
        if key is not None:
            self._received(Receipt(key, name, time.monotonic(), how, sent))
        return key

    async def _retry(
        self,
        session: aiohttp.ClientSession,
        base: str,
        name: str,
        headers: dict[str, str],
        asked: list[tuple[str, str, float]],
        which: int,
    ) -> None:
        """Repeat the request ``asked[which]``; an answer afresh (its record was
        forgotten with a release, or expired) becomes the request's answer."""
        idempotency_key, first, first_at = asked[which]
        url = f"{base}/v1/idgenerator/{LIFECYCLE_TYPE}/id"
        replayed: list[bool] = []
        retry = headers | {"Idempotency-Key": idempotency_key}
        sent = time.monotonic()
        body = await self._call(session, "POST", url, retry, replayed=replayed)
        again = _openg2p_id(body)
        if again is None:
            return
        now = time.monotonic()
        self.retries.append(
            Retry(name, idempotency_key, first, again, now, any(replayed), first_at)
        )
        if not any(replayed):  # answered afresh (the first key was given back): a new hand
            self._received(Receipt(again, name, now, "retry", sent))
            asked[which] = (idempotency_key, again, now)

    async def _change(
        self,
        session: aiohttp.ClientSession,
        base: str,
        name: str,
        headers: dict[str, str],
        key: str,
        status: str,
    ) -> Change:
        sent = time.monotonic()
        answer = await self._put(session, base, headers, key, status)
        change = Change(key, name, status, sent, answer in DONE[status])
        self.changes.append(change)
        return change

    async def _put(
        self,
        session: aiohttp.ClientSession,
        base: str,
        headers: dict[str, str],
        key: str,
        status: str,
    ) -> str:
        """MOSIP's PUT of ``status``: the status answered, MOSIP's error code, or "" when
        no answer came (a timeout, a transport error)."""
        request = MOSIP_PUT | {
            "requesttime": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
            "request": {"uin": key, "status": status},
        }
        errors: list[str] = []
        url = f"{base}/v1/idgenerator/uin"
        body = await self._call(session, "PUT", url, headers, request, codes=errors)
        answer = (body or {}).get("response") or {}
        if body is not None and answer.get("uin") == key:
            return str(answer.get("status"))
        return errors[0] if errors else ""

    async def _call(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        headers: dict[str, str],
        json: dict[str, Any] | None = None,
        replayed: list[bool] | None = None,
        codes: list[str] | None = None,
    ) -> dict[str, Any] | None:
        """The answer's body when it is 200 with no error; else None (counted, and with
        ``codes`` the error code appended to it). With ``replayed``, whether the answer
        was a replay is appended to it."""
        try:
            async with session.request(method, url, headers=headers, json=json) as reply:
                if replayed is not None:
                    replayed.append(reply.headers.get("Idempotent-Replayed") == "true")
                body = await reply.json(content_type=None)
                errors = body.get("errors") if isinstance(body, dict) else None
                if reply.status == 200 and not errors:
                    return dict(body)
                code = str(errors[0]["errorCode"]) if errors else str(reply.status)
                self.errors[f"{method} {code}"] += 1
                if codes is not None:
                    codes.append(code)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as exc:
            self.errors[f"{method} {type(exc).__name__}"] += 1
        return None


def _mosip_uin(body: dict[str, Any] | None) -> str | None:
    uin = ((body or {}).get("response") or {}).get("uin")
    return str(uin) if uin else None


def _openg2p_id(body: dict[str, Any] | None) -> str | None:
    value = ((body or {}).get("response") or {}).get("id")
    return str(value) if value else None


@dataclass(frozen=True)
class Issue:
    """One issue of a key, as the ledger holds it at the end."""

    client: str
    used: bool
    released: bool


async def ledger_issues(dsn: str) -> dict[str, list[Issue]]:
    """key -> every issue the ledger holds of it: the current row and those released."""
    conn = await asyncpg.connect(dsn)
    try:
        current = await conn.fetch(
            sql.for_type(
                "SELECT key, client, used_at IS NOT NULL AS used, "
                "released_at IS NOT NULL AS released FROM {ledger}",
                LIFECYCLE_TYPE,
            )
        )
        past = await conn.fetch(
            "SELECT key, client FROM kd_released_issues WHERE id_type = $1", LIFECYCLE_TYPE
        )
    finally:
        await conn.close()
    issues: dict[str, list[Issue]] = defaultdict(list)
    for row in current:
        issues[row["key"]].append(Issue(row["client"], row["used"], row["released"]))
    for row in past:
        issues[row["key"]].append(Issue(row["client"], False, True))
    return issues


def check(
    load: LifecycleLoad, issues: dict[str, list[Issue]], spans: list[LossSpan]
) -> dict[str, Any]:
    """The lifecycle's history against the ledger (module docstring). A record made
    while a fault in ``spans`` destroyed it by definition (a restart without
    persistence or from an older snapshot, of what it held) is counted apart, charged
    to that fault by its time."""
    destroyed = [s for s in spans if s.fault in REPLICA_LOSS_FAULTS]
    lost_to_fault: Counter[str] = Counter()

    def excused(at: float, sent: float = -1.0) -> bool:
        found = [s for s in destroyed if s.may_hold(at if sent < 0 else sent, at)]
        if found:
            lost_to_fault[max(found, key=lambda s: s.start).fault] += 1
        return bool(found)

    missing = [r for r in load.receipts if not issues.get(r.key) and not excused(r.at, r.sent)]
    # A receipt whose issue a restart destroyed, of a key issued to others before or
    # after it, is lost to that fault too, not recorded under another client.
    wrong = [
        r
        for r in load.receipts
        if issues.get(r.key)
        and not any(i.client == r.client for i in issues[r.key])
        and not excused(r.at, r.sent)
    ]
    lost = [
        c
        for c in load.changes
        if c.acknowledged and not _holds(c, issues.get(c.key, [])) and not excused(c.sent)
    ]
    given_back: dict[tuple[str, str], list[float]] = defaultdict(list)
    for c in load.changes:
        if c.status == "UNASSIGNED" and c.acknowledged:
            given_back[(c.client, c.key)].append(c.sent)
    # A replay of a request whose key its client gave back after that request (a Redis
    # split brain: the old primary never saw the release), and of those, one whose key
    # had been handed to another client by then: a key in two hands.
    retried_back = [
        r
        for r in load.retries
        if r.replayed and any(r.first_at < t < r.at for t in given_back[(r.client, r.first)])
    ]
    received = defaultdict(list)
    for receipt in load.receipts:
        received[receipt.key].append(receipt)
    taken_since = [
        r
        for r in retried_back
        if any(
            other.client != r.client and r.first_at < other.at < r.at for other in received[r.first]
        )
    ]
    # PUT pairs: one applied and the other refused, whichever came first; never both,
    # and what was applied holds (status_changes_lost counts it when not).
    both = [
        p
        for p in load.pairs
        if p.assigned in DONE["ASSIGNED"] and p.unassigned in DONE["UNASSIGNED"]
    ]
    decided = [p for p in load.pairs if NOT_ISSUED in (p.assigned, p.unassigned) and p not in both]
    # An acknowledged PUT ASSIGNED asked again is answered ASSIGNED (when answered with
    # what the ledger decided: KER-UIG-005, the ledger behind while a failover lasts,
    # or no answer at all, decides nothing).
    reversed_ = [
        r
        for r in load.repeats
        if r.answer in DECIDED and r.answer != "ASSIGNED" and not excused(r.first_sent)
    ]
    return {
        "uins_received": len(load.receipts),
        "put_pairs": len(load.pairs),
        "put_pairs_decided": len(decided),
        "put_pairs_both_applied": len(both),
        "repeats": len(load.repeats),
        "repeats_contradicted": len(reversed_),
        "repeats_unanswered": sum(1 for r in load.repeats if r.answer not in DECIDED),
        "repeats_contradicted_sample": [f"{r.key} {r.client}: {r.answer}" for r in reversed_[:10]],
        "status_changes_acknowledged": sum(1 for c in load.changes if c.acknowledged),
        "retries": len(load.retries),
        "uins_reissued": _reissued(load, issues),
        "keys_in_two_hands": _in_two_hands(load, issues),
        "status_changes_lost": len(lost),
        "ledger_wrong_client": len(wrong),
        "ledger_missing": len(missing),
        "replays_of_given_back_keys": len(retried_back),
        "replays_of_keys_reissued": len(taken_since),
        "lost_to_fault": dict(lost_to_fault),
        "replays_of_keys_reissued_sample": [
            f"{r.client} {r.idempotency_key} {r.first}" for r in taken_since[:5]
        ],
        "missing_sample": sorted(r.key for r in missing)[:10],
        "wrong_client_sample": [
            f"{r.key} to {r.client} ({r.how}) at {r.at:.3f}; ledger: "
            + ", ".join(f"{i.client}{' released' if i.released else ''}" for i in issues[r.key])
            for r in wrong[:10]
        ],
        "lost_sample": [f"{c.key} {c.status} {c.client}" for c in lost[:10]],
        "errors": dict(load.errors),
    }


def _holds(change: Change, issues: list[Issue]) -> bool:
    """Whether the ledger still says what an acknowledged change answered."""
    mine = [i for i in issues if i.client == change.client]
    if change.status == "ASSIGNED":
        return any(i.used for i in mine)
    return any(i.released for i in mine)


def _in_two_hands(load: LifecycleLoad, issues: dict[str, list[Issue]]) -> int:
    """Keys handed to a client while another held them: a hold runs from a receipt to
    its client's release of the key (a release acknowledged, or one the ledger shows
    applied), else to the end."""
    released: dict[tuple[str, str], list[float]] = defaultdict(list)
    for change in load.changes:
        if change.status != "UNASSIGNED":
            continue
        applied = any(i.client == change.client and i.released for i in issues.get(change.key, []))
        if change.acknowledged or applied:
            released[(change.client, change.key)].append(change.sent)
    holds: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for receipt in load.receipts:
        ends = [t for t in released[(receipt.client, receipt.key)] if t >= receipt.at]
        holds[receipt.key].append((receipt.at, min(ends, default=float("inf")), receipt.client))
    twice = 0
    for spans in holds.values():
        spans.sort()
        if any(
            later[0] < earlier[1] and later[2] != earlier[2]
            for i, earlier in enumerate(spans)
            for later in spans[i + 1 :]
        ):
            twice += 1
    return twice


def _reissued(load: LifecycleLoad, issues: dict[str, list[Issue]]) -> int:
    """Keys the lifecycle saw handed out more than once (released, then issued again)."""
    seen = Counter(r.key for r in load.receipts)
    return sum(1 for key, n in seen.items() if n > 1 and len(issues.get(key, [])) > 1)

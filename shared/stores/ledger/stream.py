"""The ledger in Redis: the stream of entries (issued keys, appended by the pop scripts;
marks of use and releases), drained into PostgreSQL by keysync through a consumer
group; and the ledger log, what each ledger transaction wrote, kept for a restore
(docs/reliability.md, "The ledger's one history")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.domain.tiers import Stamp
from shared.stores.redis.endpoint import RedisEndpoint
from shared.stores.redis.scripts import RedisPort, Script, fence_slots

# A committed ledger transaction acknowledged: its stamp recorded, its outcomes
# published, its entries acknowledged, the log trimmed. Fenced: it records a stamp.
LEDGER_CONFIRM = Script(
    "ledger_confirm",
    lambda ns: [
        *fence_slots(ns),
        redis_keys.ledger_stream_key(ns),
        redis_keys.ledger_log_key(ns),
        redis_keys.ledger_confirmed_key(ns),
    ],
    fenced=True,
)
# How long the outcome of a status change is kept for the client waiting for it (it
# waits dispenser.mosip.ledger_wait_s at most; a retry is answered from kd_outcomes).
OUTCOME_TTL_S = 3_600
# How many confirmations the confirmed stream keeps (redis_keys.ledger_confirmed_key): a
# waiter needs only to be woken by the next one.
CONFIRMED_KEPT = 16


@dataclass(frozen=True)
class Link:
    """One ledger transaction as the log holds it: its id, the link it follows ("": the
    lane's first) and what it wrote (``shared.stores.ledger.batch.Applied.ops``)."""

    id: str
    prev: str
    ops: list[dict[str, Any]]


FORGET_CONSUMER = Script(
    "forget_consumer",
    lambda ns, consumer: [
        redis_keys.ledger_stream_key(ns),
        redis_keys.ledger_consumer_key(ns, consumer),
    ],
    fenced=False,
)

LEDGER_GROUP = "kd-ledger"  # the consumer group keysync drains the ledger stream with
LedgerEntry = tuple[str, dict[str, str]]
# How long a draining keysync's heartbeat lives: it beats before every read (at least
# every block, half a second), so a consumer whose heartbeat expired has stopped.
CONSUMER_HEARTBEAT_MS = 10_000


class LedgerStream(RedisPort):
    @classmethod
    def from_settings(cls, settings: Settings) -> LedgerStream:
        return cls(RedisEndpoint.from_settings(settings), settings.redis_key_namespace)

    async def record_used(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        reply: bool = False,
    ) -> str:
        """Append a "used" event to the stream (applied by keysync's drain); its entry ID.

        The drain applies it only to keys issued to ``client``, unless ``admin`` (the
        client has ledger permission), and records ``client`` as who marked each key.
        With ``reply`` (one key: a status change a client waits for) the drain decides
        its outcome once and publishes it (``outcome``).
        """
        return await self._record("used", name, keys, client, admin, reply=reply)

    async def record_released(
        self,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool = False,
        forget: Sequence[tuple[str, str]] = (),
        reply: bool = False,
    ) -> str:
        """Append a "release" event: keys ``client`` gives back unused (applied, as a
        mark of use is, only to keys issued to it unless ``admin``); its entry ID.

        ``forget``: the (client, Idempotency-Key) pairs the keys were issued under; their
        records go in the same step, so a retry of the first request never gets back a
        key given back (and perhaps issued again since): it is answered afresh."""
        records = [redis_keys.idempotency_key(self.namespace, c, k) for c, k in forget]
        return await self._record("release", name, keys, client, admin, records, reply)

    async def outcome(self, name: str, entry: str) -> str | None:
        """The outcome decided for the status change recorded as ``entry`` (None: not
        decided yet)."""
        async with self._guard("ledger_outcome"):
            found = await (await self._endpoint.client()).get(
                redis_keys.ledger_outcome_key(self.namespace, entry)
            )
        return None if found is None else _entry_id(found)

    async def confirmed_mark(self, name: str) -> str:
        """The newest confirmation of the stream that holds type ``name``'s entries
        ("0-0": none yet): what ``wait_confirmed`` waits past. Read before looking at
        what a waiter waits for, so no confirmation after that look is missed."""
        async with self._guard("ledger_confirmed"):
            found = await (await self._endpoint.client()).xrevrange(
                redis_keys.ledger_confirmed_key(self.namespace), count=1
            )
        return _entry_id(found[0][0]) if found else "0-0"

    async def wait_confirmed(self, name: str, mark: str, timeout_ms: int) -> str:
        """Block until a ledger transaction is confirmed after ``mark``, at most
        ``timeout_ms``; the newest mark seen (``mark`` when none came)."""
        key = redis_keys.ledger_confirmed_key(self.namespace)
        async with self._guard("ledger_wait_confirmed"):
            answer: Any = await (await self._endpoint.client()).xread(
                {key: mark}, block=max(1, timeout_ms)
            )
        seen = [entry for _, entries in answer or [] for entry, _ in entries]
        return _entry_id(seen[-1]) if seen else mark

    async def _record(
        self,
        op: str,
        name: str,
        keys: Sequence[str],
        client: str,
        admin: bool,
        forget: Sequence[str] = (),
        reply: bool = False,
    ) -> str:
        fields: dict[Any, Any] = {"op": op, "type": name, "keys": " ".join(keys), "clients": client}
        if admin:
            fields["admin"] = "1"
        if reply:
            fields["reply"] = "1"
        stream = redis_keys.ledger_stream_key(self.namespace)
        async with self._guard(f"record_{op}"):
            client_ = await self._endpoint.client()
            if not forget:
                return _entry_id(await client_.xadd(stream, fields))
            async with client_.pipeline(transaction=True) as pipe:
                pipe.xadd(stream, fields)
                pipe.delete(*forget)
                entry, _ = await pipe.execute()
        return _entry_id(entry)

    async def wait_durable(
        self, name: str, durability: str, replicas: int, timeout_ms: int
    ) -> bool:
        """Whether every write made before this call (the issue entries of pops that
        returned) is on ``replicas`` replicas (``replicated``: WAIT), or in the
        primary's and ``replicas`` replicas' append-only files (``fsynced``: WAITAOF),
        within ``timeout_ms``. A write of its own comes first: WAIT covers the writes of
        its own connection, and one made after the pops covers theirs."""
        async with self._guard("ledger_confirm"):
            client = await self._endpoint.client()
            async with client.pipeline(transaction=False) as pipe:
                pipe.incr(redis_keys.ledger_confirm_key(self.namespace))
                if durability == "fsynced":
                    pipe.execute_command("WAITAOF", 1, replicas, timeout_ms)
                else:
                    pipe.wait(replicas, timeout_ms)
                _, acked = await pipe.execute()
        if durability == "fsynced":
            local, remote = (int(n) for n in acked)
            return local >= 1 and remote >= replicas
        return int(acked) >= replicas

    async def newest_entry(self, name: str) -> str | None:
        """The ID of the newest entry not yet applied in the stream that holds type
        ``name``'s entries (this one; None: keysync has applied all)."""
        async with self._guard("ledger_newest"):
            found = await (await self._endpoint.client()).xrevrange(
                redis_keys.ledger_stream_key(self.namespace), count=1
            )
        return _entry_id(found[0][0]) if found else None

    async def applied(self, name: str, entry: str) -> bool:
        """Whether keysync has applied every entry up to ``entry`` of the stream that
        holds type ``name``'s entries (applied entries are
        deleted from the stream, so none of them is left)."""
        async with self._guard("ledger_applied"):
            left = await (await self._endpoint.client()).xrange(
                redis_keys.ledger_stream_key(self.namespace), "-", entry, count=1
            )
        return not left

    async def beat(self, consumer: str) -> None:
        """This consumer is alive (``ledger_consumer_key``, CONSUMER_HEARTBEAT_MS)."""
        async with self._guard("ledger_beat"):
            await (await self._endpoint.client()).set(
                redis_keys.ledger_consumer_key(self.namespace, consumer),
                "1",
                px=CONSUMER_HEARTBEAT_MS,
            )

    async def read(
        self, consumer: str, count: int, block_ms: int, claim_idle_ms: int
    ) -> list[LedgerEntry]:
        """Entries for ``consumer``, oldest obligations first: those it holds already
        (a batch it read and did not acknowledge: it failed, or the process restarted
        under the same name, or a promoted replica still had it pending), then entries a
        stopped consumer (no heartbeat) left pending, then any another consumer has held
        unacknowledged for ``claim_idle_ms``, then new ones.

        A drain reads one batch at a time, so when it asks, nothing it holds is being
        applied: whatever it holds is an obligation it would otherwise leave pending
        until another consumer's claim (``claim_idle_ms``) found it."""
        stream = redis_keys.ledger_stream_key(self.namespace)
        async with self._guard("ledger_read"):
            client = await self._endpoint.client()
            try:
                mine = await self._own(client, stream, consumer, count)
                if mine:
                    return mine
                orphans = await self._claim_from_stopped(client, stream, consumer, count)
                if orphans:
                    return orphans
                _, claimed, *_ = await client.xautoclaim(
                    stream, LEDGER_GROUP, consumer, claim_idle_ms, "0-0", count=count
                )
                if claimed:
                    return [(str(i), dict(f)) for i, f in claimed if f is not None]
                answer: Any = await client.xreadgroup(
                    LEDGER_GROUP, consumer, {stream: ">"}, count=count, block=block_ms
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                    raise  # (no stream yet: XINFO says "no such key", the others NOGROUP)
                await self._create_group(client, stream)
                return []
        return [(str(i), dict(f)) for _, entries in answer for i, f in entries]

    @staticmethod
    async def _own(client: Any, stream: str, consumer: str, count: int) -> list[LedgerEntry]:
        """The entries ``consumer`` holds pending. One deleted from the stream since
        comes back without fields (None or {} by redis-py's version; a real entry always
        has some) and is left out: the XAUTOCLAIM that follows drops it from the
        pending list (Redis removes every deleted entry it scans)."""
        held: Any = await client.xreadgroup(LEDGER_GROUP, consumer, {stream: "0"}, count=count)
        return [(str(i), dict(f)) for _, entries in held for i, f in entries if f]

    async def _claim_from_stopped(
        self, client: Any, stream: str, consumer: str, count: int
    ) -> list[LedgerEntry]:
        """The pending entries of the first consumer whose heartbeat expired (it stopped
        or was killed), claimed for ``consumer``; consumers left with none are removed."""
        for other in await client.xinfo_consumers(stream, LEDGER_GROUP):
            name = str(other["name"])
            if name == consumer or await client.exists(
                redis_keys.ledger_consumer_key(self.namespace, name)
            ):
                continue
            if int(other["pending"]) == 0:
                keys = FORGET_CONSUMER.keys(self.namespace, name)
                await self._run(FORGET_CONSUMER, keys, [LEDGER_GROUP, name])
                continue
            pending = await client.xpending_range(
                stream, LEDGER_GROUP, "-", "+", count, consumername=name
            )
            ids = [entry["message_id"] for entry in pending]
            claimed = await client.xclaim(stream, LEDGER_GROUP, consumer, 0, ids) if ids else []
            found = [(str(i), dict(f)) for i, f in claimed if f is not None]
            if found:
                return found
        return []

    @staticmethod
    async def _create_group(client: Any, stream: str) -> None:
        """A new stream (or a new primary): create the group from the start."""
        try:
            await client.xgroup_create(stream, LEDGER_GROUP, id="0", mkstream=True)
        except ResponseError as race:
            if "BUSYGROUP" not in str(race):  # another keysync just created it
                raise

    async def add_link(self, link: str, prev: str, ops: list[dict[str, Any]]) -> None:
        """Copy a ledger transaction's writes to the log, before it commits (its
        guard holds the clock row's lock meanwhile): a link a restore may need is always
        there once committed."""
        fields: dict[Any, Any] = {
            "id": link,
            "prev": prev,
            "ops": json.dumps(ops, separators=(",", ":")),
        }
        async with self._guard("ledger_log"):
            await (await self._endpoint.client()).xadd(
                redis_keys.ledger_log_key(self.namespace), fields
            )

    async def confirm_link(
        self,
        stamp: Stamp,
        outcomes: dict[str, str],
        entry_ids: Sequence[str],
        retain_ms: int,
    ) -> str:
        """Confirm a committed ledger transaction (``stamp`` names its link): record
        its stamp, clear the restore pending (this link is it or follows it), publish
        its outcomes, acknowledge and delete its entries, trim the log
        (lua/ledger_confirm.lua). Returns 'ok', or why the stamp was refused."""
        pairs = [item for pair in outcomes.items() for item in pair]
        args = [
            LEDGER_GROUP,
            retain_ms,
            redis_keys.ledger_outcome_key(self.namespace, ""),
            OUTCOME_TTL_S,
            CONFIRMED_KEPT,
            *stamp.args(self.namespace),
            len(outcomes),
            *pairs,
            *entry_ids,
        ]
        async with self._guard("ledger_confirm"):
            status, _ = await self._run(LEDGER_CONFIRM, LEDGER_CONFIRM.keys(self.namespace), args)
        return str(status)

    async def acknowledge(self, outcomes: dict[str, str], entry_ids: Sequence[str]) -> None:
        """With the PostgreSQL fence switched off (a drill's control): publish the
        outcomes and acknowledge the entries, with no stamp and no log."""
        stream = redis_keys.ledger_stream_key(self.namespace)
        async with self._guard("ledger_ack"):
            client = await self._endpoint.client()
            async with client.pipeline(transaction=True) as pipe:
                for entry, outcome in outcomes.items():
                    key = redis_keys.ledger_outcome_key(self.namespace, entry)
                    pipe.set(key, outcome, nx=True, ex=OUTCOME_TTL_S)
                if entry_ids:
                    pipe.xack(stream, LEDGER_GROUP, *entry_ids)
                    pipe.xdel(stream, *entry_ids)
                confirmed = redis_keys.ledger_confirmed_key(self.namespace)
                pipe.xadd(confirmed, {"acked": len(entry_ids)}, maxlen=CONFIRMED_KEPT)
                await pipe.execute()

    async def links_newest_first(self, chunk: int = 200) -> AsyncIterator[Link]:
        """Every link the log holds, newest first."""
        log = redis_keys.ledger_log_key(self.namespace)
        end = "+"
        while True:
            async with self._guard("ledger_log_read"):
                found: Any = await (await self._endpoint.client()).xrevrange(
                    log, end, "-", count=chunk
                )
            for _, raw in found:
                fields = {_entry_id(k): _entry_id(v) for k, v in dict(raw or {}).items()}
                yield Link(
                    fields.get("id", ""),
                    fields.get("prev", ""),
                    json.loads(fields.get("ops", "[]")),
                )
            if len(found) < chunk:
                return
            end = f"({_entry_id(found[-1][0])}"

    async def forget_retired(self) -> None:
        """Delete what earlier versions kept (redis_keys.ledger_retired_keys)."""
        async with self._guard("ledger_retired"):
            await (await self._endpoint.client()).delete(
                redis_keys.ledger_retained_key(self.namespace),
                redis_keys.ledger_replayed_key(self.namespace),
            )

    async def backlog(self, name: str = "") -> int:
        """The length of this stream (the one that holds type ``name``'s entries)."""
        async with self._guard("ledger_backlog"):
            return int(
                await (await self._endpoint.client()).xlen(
                    redis_keys.ledger_stream_key(self.namespace)
                )
            )


def _entry_id(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)

"""Machine-ID leases in Redis: acquire, renew, release, list; every call behind the fence.

The rules live in ``lua/lease*.lua``: a lease is granted, extended and released only by
compare-and-set in one script call, carries the epoch it was granted in (the server
identity and when the fence took over: a new epoch refuses its renewal), and no lease
is granted for one TTL after the fence takes over. Each machine ID keeps a non-expiring
record of the highest timestamp its holders may have minted (``last``), handed to the
next holder as its floor.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from shared.domain import redis_keys
from shared.domain.errors import StoreUnavailable
from shared.domain.leases import NO_WAIT, LeaseWait, check_pool
from shared.stores.redis.endpoint import RedisEndpoint
from shared.stores.redis.scripts import RedisPort, Script, fence_slots


def lease_keys(ns: str, pool: str) -> list[str]:
    """Every lease script's keys: the fence's slots, then the pool's leases, its last
    timestamps, the longest TTL granted."""
    return [
        *fence_slots(ns),
        redis_keys.machine_leases_key(ns, pool),
        redis_keys.machine_last_key(ns, pool),
        redis_keys.lease_ttl_key(ns),
    ]


# The lease scripts, each behind the fence, with the helpers of lua/lease.lua.
LEASE_ACQUIRE = Script("lease_acquire", lease_keys, fenced=True, helpers=("lease",))
LEASE_RENEW = Script("lease_renew", lease_keys, fenced=True, helpers=("lease",))
LEASE_RELEASE = Script("lease_release", lease_keys, fenced=True, helpers=("lease",))
LEASE_HOLDERS = Script("lease_holders", lease_keys, fenced=True, helpers=("lease",))


@dataclass(frozen=True)
class Acquired:
    """The answer to an acquire: ``granted``, ``full`` or ``settling``."""

    status: str
    machine_id: int  # -1 unless granted
    floor_ms: int  # highest timestamp earlier holders of the ID recorded (0: none)
    fence: str  # the lease epoch: server identity and when its fence took over
    wait_ms: int  # full: until the first lease expires; settling: until grants resume

    @property
    def granted(self) -> bool:
        return self.status == "granted"


@dataclass(frozen=True)
class Holder:
    """A live lease, as ``keydispenser lease list`` shows it."""

    machine_id: int
    owner: str
    since_ms: int  # server time of the grant (unix ms)
    expires_in_ms: int
    last_ms: int  # highest timestamp recorded for the ID


@dataclass(frozen=True)
class Holders:
    holders: list[Holder]
    settling_ms: int  # > 0: a new server identity; no grant for this long
    last_ms: dict[int, int]  # every machine ID with a record, held or not


class MachineLeases(RedisPort):
    """The machine-ID pools of one Redis deployment.

    With ``wait`` (LeaseWait), a grant or renewal counts only once that many replicas
    acknowledged it: otherwise a grant is answered 'unreplicated' (and given back), a
    renewal 'unreplicated' (the holder keeps its old deadline).
    """

    def __init__(self, endpoint: RedisEndpoint, namespace: str, wait: LeaseWait = NO_WAIT) -> None:
        super().__init__(endpoint, namespace)
        self.wait = wait

    async def _run_counted(
        self, script: Script, keys: list[str], args: list[Any]
    ) -> tuple[Any, bool]:
        """The script's reply, and whether it counts (enough replicas have it)."""
        if self.wait.replicas == 0:
            return await self._run(script, keys, args), True
        reply, acked = await self._run_acked(
            script, keys, args, self.wait.replicas, self.wait.timeout_ms
        )
        return reply, acked >= self.wait.replicas

    async def acquire(
        self, pool: str, lo: int, hi: int, owner: str, ttl_ms: int, ceiling_ms: int, start: int
    ) -> Acquired:
        """Claim a free ID of ``[lo, hi]`` for ``owner``, scanning from ``lo + start``;
        records ``ceiling_ms`` as the ID's last timestamp before granting it."""
        check_pool(pool, lo, hi)
        args = [lo, hi, start % (hi - lo + 1), owner, ttl_ms, ceiling_ms]
        async with self._guard("lease_acquire"):
            reply, counts = await self._run_counted(
                LEASE_ACQUIRE, lease_keys(self.namespace, pool), args
            )
        status, machine_id, floor, fence, wait = reply
        granted = Acquired(str(status), int(machine_id), int(floor), str(fence), int(wait))
        if granted.granted and not counts:
            await self._give_back(pool, granted.machine_id, owner)
            return Acquired("unreplicated", -1, 0, granted.fence, self.wait.timeout_ms)
        return granted

    async def _give_back(self, pool: str, machine_id: int, owner: str) -> None:
        """A grant no replica has: released (best effort; it expires by its TTL else)."""
        with contextlib.suppress(StoreUnavailable):
            await self.release(pool, machine_id, owner)

    async def renew(
        self, pool: str, machine_id: int, owner: str, fence: str, ttl_ms: int, ceiling_ms: int
    ) -> str:
        """Extend ``owner``'s lease by ``ttl_ms`` and record its new ceiling: 'renewed',
        'fenced' (new server identity), 'lost' (expired, released, someone else's) or
        'unreplicated' (no replica acknowledged it in time: it does not count)."""
        args: list[Any] = [machine_id, owner, fence, ttl_ms, ceiling_ms]
        async with self._guard("lease_renew"):
            (status,), counts = await self._run_counted(
                LEASE_RENEW, lease_keys(self.namespace, pool), args
            )
        return str(status) if counts or status != "renewed" else "unreplicated"

    async def release(
        self, pool: str, machine_id: int, owner: str, issued_ms: int | None = None
    ) -> bool:
        """Delete ``owner``'s lease; False when it was not the owner. With ``issued_ms``
        (the latest timestamp minted, minting stopped) the ID's last-timestamp record
        becomes max(floor at grant, issued_ms); without, the recorded ceiling stays."""
        args = [machine_id, owner, "" if issued_ms is None else issued_ms]
        async with self._guard("lease_release"):
            released = await self._run(LEASE_RELEASE, lease_keys(self.namespace, pool), args)
        return bool(released)

    async def holders(self, pool: str) -> Holders:
        check_pool(pool, 0, 0)
        async with self._guard("lease_holders"):
            now, settle_until, live, last = await self._run(
                LEASE_HOLDERS, lease_keys(self.namespace, pool), []
            )
        last_ms = {int(k): int(v) for k, v in _pairs(last)}
        holders = [_holder(int(k), json.loads(v), int(now), last_ms) for k, v in _pairs(live)]
        holders.sort(key=lambda h: h.machine_id)
        return Holders(holders, max(0, int(settle_until) - int(now)), last_ms)


def _pairs(flat: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip(flat[::2], flat[1::2], strict=True))


def _holder(machine_id: int, lease: dict[str, str], now: int, last: dict[int, int]) -> Holder:
    return Holder(
        machine_id,
        lease["owner"],
        int(lease["since"]),
        int(lease["expires"]) - now,
        last.get(machine_id, 0),
    )

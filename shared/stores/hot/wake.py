"""The keysync wake channel: dispensers ask for a refill now instead of at the next poll."""

from __future__ import annotations

from shared.domain import redis_keys
from shared.domain.config import Settings
from shared.stores.redis.endpoint import RedisEndpoint
from shared.stores.redis.scripts import RedisPort, Script

# keysync's wake list: its own key, no fence (a nudge only hastens a refill).
NUDGE = Script("nudge", lambda ns: [redis_keys.keysync_wake_key(ns)], fenced=False)

WAKE_LIST_MAX = 64  # a nudge only needs to be seen once; the list never grows past this


class WakeChannel(RedisPort):
    @classmethod
    def from_settings(cls, settings: Settings) -> WakeChannel:
        return cls(RedisEndpoint.from_settings(settings), settings.redis_key_namespace)

    async def nudge(self, name: str) -> None:
        """Wake a keysync for the type ``name`` now rather than at its next poll."""
        async with self._guard("nudge"):
            await self._run(NUDGE, NUDGE.keys(self.namespace), [name, WAKE_LIST_MAX])

    async def wait(self, timeout_s: float) -> str | None:
        """Block until a nudge arrives (its type's name) or the timeout passes (None)."""
        async with self._guard("wait_for_nudge"):
            client = await self._endpoint.client()
            got = await client.blpop(
                [redis_keys.keysync_wake_key(self.namespace)], timeout=timeout_s
            )
        return None if got is None else str(got[1])

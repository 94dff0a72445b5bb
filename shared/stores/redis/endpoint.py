"""Where the Redis primary is: a plain URL, resolved through Sentinel, or the primary
that holds the namespace's hash slot in a Redis Cluster.

redis-py's SentinelConnectionPool keeps retrying the old master's address
(redis-py issue #3874) and does not re-resolve on READONLY/NOREPLICAS. So the
address is resolved here and a plain client is kept for it; any failure that
may mean "the primary moved" marks the endpoint stale, and the next use
resolves again (single-flight, rate-limited). Resolution asks every Sentinel at
once and takes a reported address whose server says it is a primary: during a
failover only the leading Sentinel already names the promoted replica.

On a Redis Cluster every key of a namespace shares one hash slot (the namespace is
the keys' hash tag, ``Settings.redis_key_namespace``), so a process needs one
primary there too: the one that serves that slot. It is found the same way, from
the slot map (``CLUSTER SLOTS``) every given node reports, and taken only when that
server says it is a primary and serves the slot itself; a MOVED, ASK, TRYAGAIN or
CLUSTERDOWN reply marks the endpoint stale like a READONLY one. Every script then
runs where all its keys are, on a plain connection, exactly as on one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MovedError,
    ReadOnlyError,
    RedisError,
    TimeoutError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.domain.config.redis import ClusterConfig, SentinelConfig, ServerAccess
from shared.domain.errors import ConfigError, StoreUnavailable

if TYPE_CHECKING:
    from shared.domain.config.settings import Settings

log = logging.getLogger(__name__)
_RESOLVE_EVERY_S = 0.05  # at most this often while the primary cannot be found
_VERIFY_EVERY_S = 1.0  # with Sentinel: re-check which server is the primary
# redis-py retries a failed command up to 10 times with backoff by default: that
# re-runs non-idempotent pops blindly and stalls callers for seconds during a
# failover. Every client here has it off; retries are decided by the caller.
NO_RETRY = Retry(NoBackoff(), 0)
_TIMEOUTS: dict[str, Any] = {
    "socket_connect_timeout": 1.0,
    "socket_timeout": 5.0,
    "retry": NO_RETRY,
}


class RedisEndpoint:
    def __init__(
        self,
        url: str | None = None,
        sentinel: SentinelConfig | None = None,
        cluster: ClusterConfig | None = None,
        key_namespace: str = "",
    ) -> None:
        """``cluster``: the primary of ``key_namespace``'s hash slot is the one used
        (``Settings.redis_key_namespace``: every key is named under it)."""
        if cluster is not None and not key_namespace:
            raise ValueError("a cluster endpoint needs the key namespace its slot is of")
        self._url = url
        self._discovered: ServerAccess | None = sentinel or cluster
        self._sentinel_config = sentinel
        self._cluster_config = cluster
        self._slot = key_slot(key_namespace.encode()) if cluster is not None else None
        self._sentinels: list[aioredis.Redis] = []
        # Cluster nodes asked for the map, one client each, kept (a re-check a second
        # would otherwise open a connection to every node each time).
        self._nodes: dict[tuple[str, int], aioredis.Redis] = {}
        # Every node of the cluster the nodes asked named (CLUSTER NODES): asked when
        # none of the given nodes answers (they may all be down, or replaced).
        self._learned: list[tuple[str, int]] = []
        self._client: aioredis.Redis | None = None
        self._address: tuple[str, int] | None = None
        self._stale = True
        self._last_resolve = 0.0
        self._lock = asyncio.Lock()
        self._verifying: asyncio.Future[None] | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisEndpoint:
        """The endpoint of the one key group (``redis_key_namespace``). Refused with
        a cluster's ``slot_per: type``: there each type's keys have a primary of their
        own (``for_keys``, ``shared.stores.groups``)."""
        if settings.slot_per_type:
            raise ValueError("redis_cluster.slot_per is 'type': no one endpoint serves all keys")
        return cls.for_keys(settings, settings.redis_key_namespace)

    @classmethod
    def for_keys(cls, settings: Settings, namespace: str) -> RedisEndpoint:
        """The endpoint of the keys under ``namespace`` (a key group's)."""
        return cls(settings.redis_url, settings.redis_sentinel, settings.redis_cluster, namespace)

    @property
    def address(self) -> tuple[str, int] | None:
        return self._address

    @property
    def named(self) -> bool:
        """Whether a Redis was named (a URL, Sentinel or a cluster); an endpoint built
        without any falls back to 127.0.0.1:6379/0, whatever runs there."""
        return self._url is not None or self._discovered is not None

    async def client(self) -> aioredis.Redis:
        """The client for the current primary, resolving it first when stale.

        While the primary cannot be found, callers fail at once rather than queue:
        one resolution runs at a time, at most every ``_RESOLVE_EVERY_S``. With
        Sentinel, the primary is also re-checked in the background every
        ``_VERIFY_EVERY_S``: a restarted old primary answers at its old address as
        an empty primary until Sentinel demotes it, and no error would say so (on a
        cluster: until the cluster's map moved its slot).
        """
        if self._client is not None and not self._stale:
            if self._discovered is not None and self._verify_due():
                self._verifying = asyncio.ensure_future(self._verify())
            return self._client
        if self._lock.locked() or time.monotonic() < self._last_resolve + _RESOLVE_EVERY_S:
            if self._client is not None and not self._stale:
                return self._client
            raise StoreUnavailable("redis", "looking for the primary")
        async with self._lock:
            if self._client is None or self._stale:
                self._last_resolve = time.monotonic()
                await self._resolve()
        assert self._client is not None
        return self._client

    def _verify_due(self) -> bool:
        idle = self._verifying is None or self._verifying.done()
        return idle and time.monotonic() - self._last_resolve > _VERIFY_EVERY_S

    async def _verify(self) -> None:
        async with self._lock:
            self._last_resolve = time.monotonic()
            with contextlib.suppress(StoreUnavailable):
                await self._resolve()

    def invalidate(self) -> None:
        """The primary may have moved: resolve again before the next command."""
        if self._discovered is not None:
            self._stale = True

    async def _resolve(self) -> None:
        if self._discovered is None:
            self._client = self._client or aioredis.Redis.from_url(
                self._url or "redis://127.0.0.1:6379/0", decode_responses=True, **_TIMEOUTS
            )
            self._stale = False
            return
        if self._cluster_config is not None:
            candidates, problems = await self._slot_primaries(self._cluster_config)
        else:
            candidates, problems = await self._reported_primaries()
        # Prefer a newly reported primary: during a failover only the leading
        # Sentinel reports the promoted replica, the others still name the old one
        # (and cluster nodes learn of a failover one after the other).
        candidates.sort(key=lambda address: address == self._address)
        for address in candidates:
            problem = await _primary_problem(address, self._discovered, self._slot)
            if problem is None:
                await self._use(address)
                return
            problems.append(f"{_where(address)} reported as primary: {problem}")
        refused = [p for p in problems if CERTIFICATE_REFUSED in p]
        if refused:
            raise self.certificate_error(refused[0])
        raise StoreUnavailable("redis", "no primary found: " + "; ".join(problems))

    async def _slot_primaries(
        self, config: ClusterConfig
    ) -> tuple[list[tuple[str, int]], list[str]]:
        """The primary of this namespace's slot, as the given nodes (and the one in use)
        report it, asked in parallel, and what went wrong with each node that did not.

        Nodes may disagree for a moment: a node restarted empty still claims the slots
        its config file gives it until the cluster tells it they moved. The cluster's
        own rule settles it: the claim with the highest config epoch wins; lower ones
        are not candidates at all."""
        assert self._slot is not None
        asked = config.addresses()
        if self._address is not None and self._address not in asked:
            asked.append(self._address)
        claims, problems, silent = await self._claims(asked, config)
        others = [address for address in self._learned if address not in asked]
        # No claim, or only claims of nodes that did not answer (a node that has not yet
        # heard of a failover names the dead primary): ask the nodes the cluster named.
        if others and all(address in silent for _, address in claims):
            more_claims, more, _ = await self._claims(others, config)
            claims, problems = claims + more_claims, problems + more
        await self._forget_nodes_left(config)
        top = max((epoch for epoch, _ in claims), default=None)
        found: list[tuple[str, int]] = []
        for epoch, address in claims:
            if epoch == top and address not in found:
                found.append(address)
        return found, problems

    async def _forget_nodes_left(self, config: ClusterConfig) -> None:
        """Close the probes of nodes neither listed, nor in use, nor named any more."""
        keep = {*config.addresses(), *self._learned, self._address}
        for address in [a for a in self._nodes if a not in keep]:
            probe = self._nodes.pop(address, None)  # a background re-check may be here too
            if probe is not None:
                await probe.aclose()

    async def _claims(
        self, asked: list[tuple[str, int]], config: ClusterConfig
    ) -> tuple[list[tuple[int, tuple[str, int]]], list[str], set[tuple[str, int]]]:
        """What each node asked claims of this slot (its config epoch and primary), what
        went wrong with each node that claimed nothing, and the nodes that did not
        answer. The cluster's nodes, as the answers name them, replace those learned."""
        assert self._slot is not None
        answers = await asyncio.gather(
            *(_slot_claim(self._node(address, config), address, self._slot) for address in asked),
            return_exceptions=True,
        )
        claims: list[tuple[int, tuple[str, int]]] = []
        problems: list[str] = []
        silent: set[tuple[str, int]] = set()
        named: list[tuple[str, int]] = []
        for node, answer in zip(asked, answers, strict=True):
            if isinstance(answer, BaseException):
                problems.append(f"cluster node {_where(node)}: {answer}")
                silent.add(node)
                continue
            claim, members = answer
            for member in members:
                if (reached := config.reachable(member)) not in named:
                    named.append(reached)
            if claim is None:
                problems.append(f"cluster node {_where(node)}: no node serves slot {self._slot}")
            else:
                claims.append((claim[0], config.reachable(claim[1])))
        if named:
            self._learned = named
        return claims, problems, silent

    def _node(self, address: tuple[str, int], config: ClusterConfig) -> aioredis.Redis:
        client = self._nodes.get(address)
        if client is None:
            client = self._nodes[address] = redis_client(
                address, config, socket_connect_timeout=0.5, socket_timeout=0.5
            )
        return client

    async def _reported_primaries(self) -> tuple[list[tuple[str, int]], list[str]]:
        """Every distinct primary address the Sentinels report, asked in parallel, and
        what went wrong with each Sentinel that did not report one."""
        config = self._sentinel_config
        assert config is not None
        if not self._sentinels:
            secret = config.sentinel_password
            self._sentinels = [
                redis_client(
                    address,
                    config,
                    db=0,
                    username=config.sentinel_username,
                    password=secret.get_secret_value() if secret else None,
                )
                for address in config.addresses()
            ]
        answers = await asyncio.gather(
            *(
                _command(s, "SENTINEL", "get-master-addr-by-name", config.master_name)
                for s in self._sentinels
            ),
            return_exceptions=True,
        )
        found: list[tuple[str, int]] = []
        problems: list[str] = []
        for sentinel, answer in zip(config.addresses(), answers, strict=True):
            if isinstance(answer, list | tuple) and len(answer) == 2:
                address = config.reachable((str(answer[0]), int(answer[1])))
                if address not in found:
                    found.append(address)
            elif isinstance(answer, BaseException):
                problems.append(f"sentinel {_where(sentinel)}: {answer}")
            else:
                problems.append(
                    f"sentinel {_where(sentinel)}: knows no primary named {config.master_name!r}"
                )
        return found, problems

    async def _use(self, address: tuple[str, int]) -> None:
        config = self._discovered
        assert config is not None
        if address != self._address or self._client is None:
            old = self._client
            self._client = redis_client(address, config)
            if old is not None:
                await old.aclose()
            log.info("redis_primary", extra={"host": address[0], "port": address[1]})
            self._address = address
        self._stale = False

    def certificate_error(self, detail: str) -> ConfigError:
        """A server's certificate refused: a setup to fix (its CA, the host name), named
        by the setting that says where Redis is; never an outage to retry."""
        if self._cluster_config is not None:
            where = "redis_cluster.tls_ca_file"
        elif self._sentinel_config is not None:
            where = "redis_sentinel.tls_ca_file"
        else:
            where = "redis_url (ssl_ca_certs)"
        return ConfigError(
            f"{where}: the Redis server's certificate was refused: {detail}: the CA file "
            "must hold the CA that signed it, and the certificate must name the host "
            "connected to"
        )

    async def close(self) -> None:
        if self._verifying is not None:
            self._verifying.cancel()
        if self._client is not None:
            await self._client.aclose()
        for each in [*self._sentinels, *self._nodes.values()]:
            await each.aclose()


async def _command(client: aioredis.Redis, *args: Any) -> Any:
    """A raw command (redis-py leaves execute_command untyped)."""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


def redis_client(
    address: tuple[str, int], config: ServerAccess | None = None, **options: Any
) -> aioredis.Redis:
    """Every client keydispenser opens to a Redis server: timeouts, no library retries."""
    secret = config.password if config else None
    settings: dict[str, Any] = {
        "db": config.database if config else 0,
        "username": config.username if config else None,
        "password": secret.get_secret_value() if secret else None,
        "decode_responses": True,
        **(_tls(config) if config is not None and config.tls else {}),
        **_TIMEOUTS,
    }
    return aioredis.Redis(host=address[0], port=address[1], **{**settings, **options})


def _tls(config: ServerAccess) -> dict[str, Any]:
    """TLS options: the server's certificate is always verified."""
    return {
        "ssl": True,
        "ssl_cert_reqs": "required",
        "ssl_ca_certs": config.tls_ca_file,
        "ssl_certfile": config.tls_cert_file,
        "ssl_keyfile": config.tls_key_file,
        "ssl_check_hostname": config.tls_check_hostname,
    }


async def _primary_problem(
    address: tuple[str, int], config: ServerAccess, slot: int | None = None
) -> str | None:
    """None when the server at ``address`` answers and says it is a primary (and, on a
    cluster, that it serves ``slot`` itself), else why not."""
    probe = redis_client(address, config, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        role = await _command(probe, "ROLE")
        if not role or role[0] not in (b"master", "master"):
            return f"its role is {role[0] if role else 'unknown'}"
        if slot is not None:
            slots = await _command(probe, "CLUSTER", "SLOTS")
            owner = _owner_in(slots, slot, address)
            if owner is None or config.reachable(owner[:2]) != address:
                return f"it does not serve slot {slot} (its map: {owner})"
    except (RedisError, OSError, ValueError, IndexError, TypeError) as exc:
        # (the last three: a reply not shaped as expected, from whatever answers there)
        return str(exc) or type(exc).__name__
    finally:
        await probe.aclose()
    return None


async def _slot_claim(
    probe: aioredis.Redis, address: tuple[str, int], slot: int
) -> tuple[tuple[int, tuple[str, int]] | None, list[tuple[str, int]]]:
    """The primary that serves ``slot`` in the view of the node at ``address`` (asked
    through ``probe``), with the config epoch that view holds for it (None: it names
    none), and every node that view lists as reachable."""
    owner = _owner_in(await _command(probe, "CLUSTER", "SLOTS"), slot, address)
    nodes = await _command(probe, "CLUSTER", "NODES")
    members = cluster_members(nodes, address)
    if owner is None:
        return None, members
    return (config_epoch(nodes, owner[2]), owner[:2]), members


def cluster_members(nodes: Any, asked: tuple[str, int]) -> list[tuple[str, int]]:
    """The addresses of a CLUSTER NODES reply's nodes (``host:port@bus[,hostname]``;
    an empty host is the asked node's), but for nodes flagged failed, without an
    address, or still in handshake."""
    text = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
    found: list[tuple[str, int]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or {"fail", "noaddr", "handshake"} & set(fields[2].split(",")):
            continue
        host, _, port = fields[1].split("@")[0].rpartition(":")
        if port.isdigit() and int(port) > 0:
            found.append((host or asked[0], int(port)))
    return found


def config_epoch(nodes: Any, node_id: str) -> int:
    """A node's config epoch in a CLUSTER NODES reply (``<id> <address> <flags>
    <primary> <ping-sent> <pong-received> <config-epoch> ...`` per line); -1 if absent."""
    text = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[0] == node_id:
            return int(fields[6])
    return -1


def _owner_in(slots: Any, slot: int, asked: tuple[str, int]) -> tuple[str, int, str] | None:
    """The primary of ``slot`` in a CLUSTER SLOTS reply ([start, end, [host, port, id],
    replicas...] per range): its host, port and node ID. An empty host means the host
    of the node asked (Redis's own rule); "?" (announced by a hostname it does not
    have) names no address: no owner can be told from such a reply."""
    for entry in slots or ():
        start, end, primary = int(entry[0]), int(entry[1]), entry[2]
        if start <= slot <= end:
            host, node_id = (_text(primary[0]), _text(primary[2]) if len(primary) > 2 else "")
            if host == "?":
                return None
            return (host or asked[0]), int(primary[1]), node_id
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _where(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


# What a refused certificate's error says (OpenSSL's reason), where only its text is
# kept (a Sentinel's or a node's answer, gathered as text).
CERTIFICATE_REFUSED = "CERTIFICATE_VERIFY_FAILED"

# Errors after which the primary may have moved (or the command did not run there).
MOVED_ERRORS: tuple[type[BaseException], ...] = (RedisConnectionError, TimeoutError, OSError)


_MOVED_TEXT = (
    "READONLY",
    "read only replica",
    "NOREPLICAS",
    "MASTERDOWN",
    "LOADING",
    "MOVED",
    "TRYAGAIN",
    "CLUSTERDOWN",
)


def certificate_refused(exc: BaseException) -> str | None:
    """Why the server's certificate was refused (an unknown CA, a host name it does not
    name), when that is what ``exc`` (or an error it was raised from) is; else None."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return str(cause.verify_message or cause)
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def describe(exc: BaseException) -> str:
    """An error's text; a cluster's redirection, whose reply redis-py strips to "slot
    host:port", says what it was."""
    if isinstance(exc, MovedError):
        return f"MOVED {exc} (another node serves the slot now)"
    if isinstance(exc, AskError):
        return f"ASK {exc} (the slot is moving to another node)"
    return str(exc)


def means_primary_moved(exc: BaseException) -> bool:
    """redis-py strips the READONLY prefix into ReadOnlyError; script errors wrap the text."""
    # AskError covers MOVED (its subclass): the slot is served elsewhere now.
    cluster_moves = (AskError, TryAgainError, ClusterDownError)
    if isinstance(exc, (*MOVED_ERRORS, ReadOnlyError, BusyLoadingError, *cluster_moves)):
        return True
    text = str(exc)
    return any(marker in text for marker in _MOVED_TEXT)

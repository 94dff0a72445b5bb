"""Each process's Redis ACL user: the commands it runs and the keys it names, nothing
else (docs/security.md, "Redis ACL users"). One table (``USERS``), rendered as an ACL
file by ``acl_file`` (``keydispenser redis-acl``; deploy/redis/users.acl is its
rendering for the default namespace), as PostgreSQL's grants come from
``shared.stores.postgres.grants``.

Scripts run with their caller's rights: Redis checks every command a script calls, and
every key it names, against the user that called it. So a user holds the commands of
every script its process runs, and every fenced script starts with the fence
(``fence.lua``: INFO, the fence's keys, UNLINK of the hot lists a new primary inherited)
and the record's and the ledger's helpers (``scripts.PROLOGUE``).

Keys: a user names its namespace's keys only (``<namespace>:*``; on a Redis Cluster the
namespace's hash tags), read and write. It deletes whole keys (DEL, UNLINK) only in the
families its own work deletes, each a selector of its own: the hot lists a fence
discards (every process that runs a fenced script), the dispenser's idempotency records,
keysync's ledger heartbeats and retired copies, and what ``retire`` removes of a type.
Nothing else is granted: no FLUSHDB or FLUSHALL, KEYS or SCAN, CONFIG, DEBUG, SCRIPT
FLUSH, MONITOR, CLIENT KILL, ACL, SHUTDOWN or REPLICAOF, for any process. Sentinel and
the replicas have users of their own, with what Redis's documentation gives them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from shared.domain.config.id_types import IdTypeConfig
from shared.domain.config.redis import RedisSettings
from shared.domain.config.settings import Settings

# What every client sends on connecting (a protocol, its database). redis-py also names
# itself (CLIENT SETINFO, Redis 7.2): refused, it goes on, and 7.0 has no such command.
CONNECTION: Final = frozenset({"ping", "hello", "select"})
# Finding and checking the primary (Sentinel's answer verified by ROLE, a cluster's slot
# map), replication acknowledgements, the server's clock and its memory policy.
PRIMARY: Final = frozenset({"role", "info", "time", "wait", "cluster|slots", "cluster|nodes"})
# A ledger type's answer once its record is on disk (ledger_durability: fsynced), Redis
# 7.2 and later: granted only when a type asks for it (7.0 refuses an ACL naming it).
FSYNCED: Final = frozenset({"waitaof"})
# Scripts by SHA, loaded when a primary lacks them (a pipeline asks first), and the
# transactions of pipelines.
SCRIPTS: Final = frozenset({"evalsha", "script|load", "script|exists", "multi", "exec"})
# The fence's prologue, which every fenced script runs first, and the sync record's
# scripts (fence.lua, sync_record.lua, ledger.lua, the record's own scripts).
FENCE: Final = frozenset(
    {
        "get",
        "set",
        "exists",
        "smembers",
        "llen",
        "hget",
        "hmget",
        "hgetall",
        "hset",
        "hsetnx",
        "hdel",
        "hincrby",
    }
)
# The machine-ID lease scripts (shared/leases/lua).
LEASES: Final = FENCE
# keysync: the push, the wake list, the ledger stream, its log and its confirmations.
KEYSYNC: Final = frozenset(
    {
        "rpush",
        "sadd",
        "blpop",
        "xadd",
        "xreadgroup",
        "xautoclaim",
        "xclaim",
        "xpending",
        "xinfo|consumers",
        "xgroup|create",
        "xgroup|delconsumer",
        "xack",
        "xdel",
        "xtrim",
        "xrange",
        "xrevrange",
        "xlen",
        "hexists",
        "incr",
    }
)
# The dispenser: pops, the nudge, ledger entries and their confirmation; MOSIP's PUT
# reads how far keysync applied the stream and blocks on its confirmations.
DISPENSER: Final = frozenset(
    {"lpop", "lpush", "ltrim", "xadd", "xlen", "incr", "xrange", "xrevrange", "xread"}
)
# retire: a type's state, in one transaction.
RETIRE: Final = frozenset({"srem"})
# import: an import's sweep of a hot list (exclude.lua's LREM) and its stock epoch.
IMPORT: Final = frozenset({"lrange", "lrem", "incr"})
# keydispenser status: the ledger's backlog.
STATUS: Final = frozenset({"xlen"})

# Key families (after "<namespace>:") whose keys a user may delete whole.
HOT_LISTS: Final = "hot:*"  # discarded by the fence on a new primary


@dataclass(frozen=True)
class RedisUser:
    """One user: ``<namespace>-<process>`` (``process`` for the servers' own)."""

    process: str
    commands: frozenset[str]
    deletes: tuple[str, ...] = ()  # key families it may DEL/UNLINK
    keys: bool = True  # whether it names the namespace's keys at all
    channels: bool = False  # every Pub/Sub channel (Sentinel's hello messages)
    namespaced: bool = True  # named after the namespace (not the servers' own users)

    def name(self, namespace: str) -> str:
        return f"{namespace}-{self.process}" if self.namespaced else self.process


BASE: Final = CONNECTION | PRIMARY | SCRIPTS | FENCE

USERS: Final[tuple[RedisUser, ...]] = (
    RedisUser("keygen", BASE, (HOT_LISTS,)),
    RedisUser("keysync", BASE | KEYSYNC, (HOT_LISTS, "ledger:retained", "ledger:replayed")),
    RedisUser("dispenser", BASE | LEASES | DISPENSER, (HOT_LISTS, "idem:*")),
    # retire, fence-postgres, ledger-resume, import (migrate touches no Redis key).
    RedisUser("admin", BASE | RETIRE | IMPORT, (HOT_LISTS, "exhausted:*", "refill:*")),
    RedisUser("status", BASE | STATUS, (HOT_LISTS,)),
    # `keydispenser lease -- COMMAND`: a machine-ID lease for a process of its own.
    RedisUser("lease", BASE | LEASES, (HOT_LISTS,)),
    # Sentinel's own user on the Redis servers (`sentinel auth-user`), and the replicas'
    # (`masteruser`): what Redis's ACL documentation gives them.
    RedisUser(
        "sentinel",
        CONNECTION
        | frozenset(
            {
                "multi",
                "exec",
                "slaveof",
                "replicaof",
                "subscribe",
                "publish",
                "config|rewrite",
                "role",
                "info",
                "client|kill",
                "script|kill",
            }
        ),
        keys=False,
        channels=True,
        namespaced=False,
    ),
    RedisUser(
        "replica",
        frozenset({"ping", "psync", "sync", "replconf"}),
        keys=False,
        namespaced=False,
    ),
)
PROCESS_USERS: Final = tuple(u.process for u in USERS if u.namespaced)


def key_prefixes(settings: RedisSettings) -> tuple[str, ...]:
    """What every key of the settings' namespace starts with, as glob patterns: the
    namespace (on a cluster, its hash tag), and with ``slot_per: type`` the tags of
    every type's and pool's own slot."""
    found = [settings.redis_key_namespace]
    if settings.slot_per_type:
        found.append("{" + settings.redis_namespace + ".*}")
    return tuple(found)


def user_names(settings: RedisSettings) -> dict[str, str]:
    """process -> its user's name."""
    return {u.process: u.name(settings.redis_namespace) for u in USERS}


def rules(user: RedisUser, settings: Settings) -> str:
    """The ACL rules of ``user`` for the settings' namespace (after its name)."""
    parts = ["resetkeys", "resetchannels", "-@all"]
    parts += [f"+{command}" for command in sorted(commands_of(user, settings))]
    prefixes = key_prefixes(settings)
    if user.keys:
        parts += [f"~{prefix}:*" for prefix in prefixes]
    if user.channels:
        parts.append("&*")
    if user.deletes:
        patterns = [f"~{prefix}:{family}" for family in user.deletes for prefix in prefixes]
        parts.append("(+del +unlink " + " ".join(patterns) + ")")
    return " ".join(parts)


def commands_of(user: RedisUser, settings: Settings) -> frozenset[str]:
    """``user``'s commands, with WAITAOF for the dispenser when a type waits for it."""
    fsynced = any(
        isinstance(c, IdTypeConfig) and c.ledger and c.ledger_durability == "fsynced"
        for c in settings.id_types.values()
    )
    return user.commands | (FSYNCED if fsynced and user.process == "dispenser" else frozenset())


def acl_file(settings: Settings, passwords: Mapping[str, str] | None = None) -> str:
    """Every user as a line of a Redis ACL file (``aclfile``; ``ACL LOAD``). With
    ``passwords`` (user name -> password) each line carries its password's SHA-256;
    without, none: a user with no password cannot log in until one is set."""
    lines = []
    for user in USERS:
        name = user.name(settings.redis_namespace)
        secret = (passwords or {}).get(name)
        password = f" #{hashlib.sha256(secret.encode()).hexdigest()}" if secret else ""
        lines.append(f"user {name} on resetpass{password} {rules(user, settings)}")
    return "\n".join(lines) + "\n"

"""Every Redis key name keydispenser uses, built by small functions.

Every function takes the namespace (``settings.redis_namespace``) as its first argument
and every name it builds starts with ``"<namespace>:"``: environments that share one
Redis server and database, each with its own namespace, never touch each other's keys.
The namespace is validated in the settings (no ``:`` inside, so two never overlap).
"""

from __future__ import annotations

import hashlib

# A type's hot list is "<namespace>:hot:<name>", and "<namespace>:hot:registry" is the
# set of every hot list the fence discards from: no ID type may take these names.
HOT_REGISTRY = "registry"
RESERVED_TYPE_NAMES = frozenset({HOT_REGISTRY})


def namespace_pattern(namespace: str) -> str:
    """A SCAN pattern matching every key of the namespace (and only those: a namespace
    holds no glob character)."""
    return f"{namespace}:*"


def hot_list_key(namespace: str, name: str) -> str:
    """The hot list of an ID type: keys ready to dispense, FIFO."""
    return f"{namespace}:hot:{name}"


def import_epoch_key(namespace: str, name: str) -> str:
    """The import epoch of an ID type (``kd_import_epochs``), set by each import before
    it sweeps the type's hot list: a keysync batch taken under an older epoch (before
    the import removed its IDs from the cold table) is refused by push.lua."""
    return f"{namespace}:import:epoch:{name}"


def stock_epoch_key(namespace: str, name: str) -> str:
    """Moved on by each import once it swept the type's hot list: a dispenser drops the
    keys its stock holds when it finds it moved (``STOCK_FRESH_S``)."""
    return f"{namespace}:import:stock:{name}"


def stock_held_key(namespace: str, name: str) -> str:
    """Set (with a TTL of ``STOCK_FRESH_S``) by each dispenser reading the stock epoch:
    while it exists, an import waits for the stocks to be read again."""
    return f"{namespace}:import:stock:{name}:held"


def keysync_wake_key(namespace: str) -> str:
    """A short list that dispensers push ID-type names to when a hot list runs low."""
    return f"{namespace}:keysync:wake"


def exhausted_key(namespace: str, name: str) -> str:
    """Set once a type's sequence is used up and its cold table is empty."""
    return f"{namespace}:exhausted:{name}"


def fence_key(namespace: str) -> str:
    """Owner token: ``run_id:master_replid`` of the server that owns the hot lists."""
    return f"{namespace}:fence"


def hot_registry_key(namespace: str) -> str:
    """Set of every hot list name, so a fence can discard them all."""
    return f"{namespace}:hot:{HOT_REGISTRY}"


def discarded_key(namespace: str) -> str:
    """Hash: hot list name -> keys discarded by fences (never reissued)."""
    return f"{namespace}:discarded"


def batch_key(namespace: str, batch_id: str) -> str:
    """Marker that a keysync batch was pushed (makes retried pushes idempotent)."""
    return f"{namespace}:batch:{batch_id}"


def idempotency_key(namespace: str, client: str, key: str) -> str:
    """Record of the keys handed out for one API client's Idempotency-Key (hashed).

    The client is part of the name: two clients sending the same header value have two
    records, so neither can replay the other's keys. Client names and Idempotency-Keys
    hold no newline, so ``client\nkey`` names one pair only.
    """
    digest = hashlib.sha256(f"{client}\n{key}".encode()).hexdigest()
    return f"{namespace}:idem:{digest}"


def ledger_stream_key(namespace: str) -> str:
    """Stream of ledger events (keys issued, keys marked used), drained into PostgreSQL."""
    return f"{namespace}:ledger"


def ledger_log_key(namespace: str) -> str:
    """Stream of what each ledger transaction wrote (one entry a link: its id, the link
    before it, its writes), added before the transaction commits and kept
    ``ledger_retain_s``: a restore after a PostgreSQL promotion writes the lost links
    again from it (docs/reliability.md, "The ledger's one history")."""
    return f"{namespace}:ledger:log"


def ledger_outcome_key(namespace: str, entry: str) -> str:
    """The outcome of the status change recorded as ``entry`` (a client waits for it),
    set once, by the acknowledgement of the ledger transaction that decided it."""
    return f"{namespace}:ledger:outcome:{entry}"


def ledger_confirmed_key(namespace: str) -> str:
    """Stream of one short entry per ledger transaction confirmed (its outcomes
    published, its entries acknowledged), capped (``LedgerStream.CONFIRMED_KEPT``): a
    client waiting for an outcome, or for keysync to catch up, blocks on it (XREAD)
    instead of polling, and reads what it waits for again after each wake-up."""
    return f"{namespace}:ledger:confirmed"


# Left by earlier versions (the retained copies of applied entries, and how far they
# were applied again); keysync deletes them at start-up.
def ledger_retained_key(namespace: str) -> str:
    return f"{namespace}:ledger:retained"


def ledger_replayed_key(namespace: str) -> str:
    return f"{namespace}:ledger:replayed"


def ledger_confirm_key(namespace: str) -> str:
    """Written after a ledger type's pop, on any connection, so that a WAIT (WAITAOF) of
    that connection covers the pop's issue entry too (``LedgerStream.wait_durable``)."""
    return f"{namespace}:ledger:confirm"


def ledger_consumer_key(namespace: str, consumer: str) -> str:
    """Heartbeat of a keysync draining the ledger stream (expires when it stops): the
    pending entries of a consumer without one are claimed first by another."""
    return f"{namespace}:ledger:consumer:{consumer}"


def refill_key(namespace: str, name: str) -> str:
    """Hash written by keysync: the observed refill rate of a hot list (keys/s) and when."""
    return f"{namespace}:refill:{name}"


def sync_record_key(namespace: str) -> str:
    """Hash: the record of PostgreSQL's sync clock kept outside PostgreSQL (the PostgreSQL
    fence, ``lua/sync_record.lua``) and the highest counter ever leased per type."""
    return f"{namespace}:sync:record"


def machine_leases_key(namespace: str, pool: str) -> str:
    """Hash of a machine-ID pool: machine id -> its lease (owner, fence token, expiry)."""
    return f"{namespace}:lease:{pool}"


def machine_last_key(namespace: str, pool: str) -> str:
    """Hash: machine id -> highest timestamp (ms) its holders may have minted; no expiry."""
    return f"{namespace}:lease:{pool}:last"


def lease_ttl_key(namespace: str) -> str:
    """The longest lease TTL (ms) granted in any pool: after the fence takes over, no
    machine ID is granted for this long (``lua/lease.lua``)."""
    return f"{namespace}:leases:ttl"

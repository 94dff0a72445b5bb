"""Every Redis key name keydispenser uses, built by small functions."""

from __future__ import annotations

import hashlib

PREFIX = "kd"


def hot_list_key(name: str) -> str:
    """The hot list of an ID type: keys ready to dispense, FIFO."""
    return f"{PREFIX}:hot:{name}"


def keysync_wake_key() -> str:
    """A short list that dispensers push ID-type names to when a hot list runs low."""
    return f"{PREFIX}:keysync:wake"


def exhausted_key(name: str) -> str:
    """Set once a type's sequence is used up and its cold table is empty."""
    return f"{PREFIX}:exhausted:{name}"


def fence_key() -> str:
    """Owner token: ``run_id:master_replid`` of the server that owns the hot lists."""
    return f"{PREFIX}:fence"


def hot_registry_key() -> str:
    """Set of every hot list name, so a fence can discard them all."""
    return f"{PREFIX}:hot:registry"


def discarded_key() -> str:
    """Hash: hot list name -> keys discarded by fences (never reissued)."""
    return f"{PREFIX}:discarded"


def batch_key(batch_id: str) -> str:
    """Marker that a keysync batch was pushed (makes retried pushes idempotent)."""
    return f"{PREFIX}:batch:{batch_id}"


def idempotency_key(client: str, key: str) -> str:
    """Record of the keys handed out for one API client's Idempotency-Key (hashed).

    The client is part of the name: two clients sending the same header value have two
    records, so neither can replay the other's keys. Client names and Idempotency-Keys
    hold no newline, so ``client\nkey`` names one pair only.
    """
    digest = hashlib.sha256(f"{client}\n{key}".encode()).hexdigest()
    return f"{PREFIX}:idem:{digest}"


def ledger_stream_key() -> str:
    """Stream of ledger events (keys issued, keys marked used), drained into PostgreSQL."""
    return f"{PREFIX}:ledger"


def refill_key(name: str) -> str:
    """Hash written by keysync: the observed refill rate of a hot list (keys/s) and when."""
    return f"{PREFIX}:refill:{name}"


def sync_record_key() -> str:
    """Hash: the record of PostgreSQL's sync clock kept outside PostgreSQL (the PostgreSQL
    fence, ``lua/sync_record.lua``) and the highest counter ever leased per type."""
    return f"{PREFIX}:sync:record"


def machine_leases_key(pool: str) -> str:
    """Hash of a machine-ID pool: machine id -> its lease (owner, fence token, expiry)."""
    return f"{PREFIX}:lease:{pool}"


def machine_last_key(pool: str) -> str:
    """Hash: machine id -> highest timestamp (ms) its holders may have minted; no expiry."""
    return f"{PREFIX}:lease:{pool}:last"


def lease_ttl_key() -> str:
    """The longest lease TTL (ms) granted in any pool: after the fence takes over, no
    machine ID is granted for this long (``lua/lease.lua``)."""
    return f"{PREFIX}:leases:ttl"

"""One root error type; every adapter translates driver errors into these."""

from __future__ import annotations


class KeydispenserError(Exception):
    """Root of every error keydispenser raises on purpose."""


class ConfigError(KeydispenserError):
    """Configuration is invalid; the message names the field."""


class SchemaError(KeydispenserError):
    """The database schema is missing or older than this code expects."""


class KeyspaceChanged(KeydispenserError):
    """A start-up tried to change an immutable keyspace field of an ID type."""

    def __init__(self, name: str, field: str, stored: object, configured: object) -> None:
        if field == "permutation_key_digest":
            # Nearly always a deployment fault (a mistyped or another environment's
            # secret), not an intended change: say how to get the right one back.
            message = (
                f"permutation_key: differs from the key the keys of '{name}' were made "
                f"with (stored digest {stored!r}, this key's {configured!r}). A mistyped "
                "or another environment's secret: set KD_PERMUTATION_KEY (or the "
                "credential) to the original, from your backup (docs/operations.md, "
                '"Backup and restore"). A keyspace\'s key never changes: a new key '
                "means a new ID type"
            )
        else:
            message = (
                f"id_types.{name}.{field}: keyspace of '{name}' is immutable once keys exist "
                f"(stored {stored!r}, configured {configured!r}); create a new ID type instead"
            )
        super().__init__(message)
        self.name = name
        self.field = field


class KeyspaceExhausted(KeydispenserError):
    """Every counter of an ID type's domain has been leased."""

    def __init__(self, name: str) -> None:
        super().__init__(f"keyspace of '{name}' is exhausted: its sequence reached MAXVALUE")
        self.name = name


class UnknownIdType(KeydispenserError):
    def __init__(self, name: str, known: tuple[str, ...] = ()) -> None:
        configured = f" (configured: {', '.join(known)})" if known else ""
        super().__init__(f"unknown id_type '{name}'{configured}")
        self.name = name


class PoolEmpty(KeydispenserError):
    """The hot list of an ID type is empty right now; retry shortly."""

    def __init__(self, name: str, retry_after_s: int) -> None:
        super().__init__(f"no keys of type '{name}' available right now; retry later")
        self.name = name
        self.retry_after_s = retry_after_s


class InvalidInput(KeydispenserError):
    """A request value is malformed (not merely invalid as an ID)."""


class IdempotencyMismatch(InvalidInput):
    """An Idempotency-Key was reused for a different ID type or count."""

    def __init__(self, key: str) -> None:
        super().__init__(
            "Idempotency-Key was already used for a different id_type or count; "
            "use a new key for a new request"
        )


class StoreUnavailable(KeydispenserError):
    """PostgreSQL or Redis could not be reached or failed."""

    def __init__(self, store: str, detail: str) -> None:
        super().__init__(f"{store}: {detail}")
        self.store = store


class LedgerDisabled(KeydispenserError):
    """A ledger operation on an ID type that keeps no ledger."""

    def __init__(self, name: str) -> None:
        super().__init__(f"id_type '{name}' keeps no ledger (set id_types.{name}.ledger)")
        self.name = name


class PostgresBehind(KeydispenserError):
    """PostgreSQL's history does not cover the sync clock's record kept in Redis: it lost
    commits (a promoted asynchronous replica). The PostgreSQL fence must run first."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"postgres lost committed work: {detail}")


class PostgresSuperseded(KeydispenserError):
    """This PostgreSQL server is on an older timeline than the one the sync clock's record
    follows: a newer primary took over while this one still takes writes (a partition,
    a split brain). It must take none from keydispenser: leases and syncs through it
    stop until the processes reach the new primary (its multi-host DSN) or it is demoted."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"postgres superseded by a newer primary: {detail}")


class RangeFenced(KeydispenserError):
    """A PostgreSQL fence ran after this range was leased: the fence discarded the cold
    inventory, and no key of the range may land after it (the range is abandoned)."""

    def __init__(self, name: str, start: int) -> None:
        super().__init__(f"range {start} of '{name}' was leased before a fence: abandoned")


class NamespaceBound(ConfigError):
    """One Redis namespace, one PostgreSQL database: this process brings a pairing other
    than the one bound on first use."""

    @classmethod
    def elsewhere(cls, namespace: str, bound: str, here: str) -> NamespaceBound:
        """The namespace is bound to database ``bound``; this process reached ``here``.
        The one rule (docs/operations.md, "Backup and restore"): the same service's data
        restored or moved keeps its namespace and is taken over; another environment
        gets a namespace of its own."""
        return cls(
            f"redis_namespace: '{namespace}' is bound to database {bound}, and this "
            f"PostgreSQL is {here}. One namespace, one database: if this is the same "
            "service's data restored or moved to a new server, keep the namespace and run "
            "`keydispenser fence-postgres --skip-ranges N --take-over` (it binds the "
            "namespace to this database and discards every key the copy could hand out "
            "twice); if it is another environment, give it a redis_namespace of its own; "
            f"else point postgres_dsn at {bound}"
        )


class FenceHalted(KeydispenserError):
    """Redis and PostgreSQL both lost state in the same window: no automatic fence can be
    proven safe, so leases and syncs stop until an operator runs the fence by hand.
    The ledger answers nothing meanwhile (its history cannot be judged)."""

    # An answer refused for a halt says when to ask again: an operator must act first.
    retry_after_s = 60

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"leases and syncs halted: {reason}; an operator must run "
            "`keydispenser fence-postgres --skip-ranges N` (docs/reliability.md)"
        )
        self.reason = reason


# The runbook section an operator follows after a ledger halt (docs/operations.md).
LEDGER_HALT_RUNBOOK = 'docs/operations.md, "KdLedgerHalted"'


def ledger_halt_message(reason: str) -> str:
    """What a halted ledger says, the same everywhere: the answers to lookups and
    MOSIP's PUTs, keysync's log, ``keydispenser status``."""
    return (
        f"halted: ledger history lost ({reason}); keys are still served, the ledger "
        "answers nothing until an operator runs `keydispenser ledger-resume "
        f"--accept-loss` (runbook: {LEDGER_HALT_RUNBOOK})"
    )


class LedgerHalted(KeydispenserError):
    """The ledger failed closed: a PostgreSQL promotion lost ledger transactions that the
    ledger log can no longer restore whole (a link trimmed, or lost with Redis state).
    Nothing is applied to the ledger, and it answers nothing, until an operator accepts
    what was lost (`keydispenser ledger-resume --accept-loss`); keys are still served."""

    # An answer refused for a halt says when to ask again: an operator must act first.
    retry_after_s = 60

    def __init__(self, reason: str) -> None:
        super().__init__(ledger_halt_message(reason))
        self.reason = reason


class LedgerBacklogFull(KeydispenserError):
    """The ledger stream holds more entries than ``dispenser.ledger_max_backlog``: keys
    of ledger types are not handed out until keysync drains it (503, Retry-After)."""

    def __init__(self, name: str, retry_after_s: int) -> None:
        super().__init__(
            f"the ledger of '{name}' is behind; no keys of it are handed out until it "
            "catches up; retry later"
        )
        self.name = name
        self.retry_after_s = retry_after_s


class ClockBehind(KeydispenserError):
    """The clock is behind the last snowflake time issued (or recorded for the machine ID)
    by more than ``max_backwards_ms``, or does not move on: nothing is minted (503)."""

    def __init__(self, name: str, behind_ms: int, bound_ms: int) -> None:
        super().__init__(
            f"the clock is {behind_ms} ms behind the last '{name}' ID issued (waits at most "
            f"{bound_ms} ms); retry later"
        )
        self.name = name
        self.behind_ms = behind_ms
        self.retry_after_s = max(1, -(-behind_ms // 1000))


class MachineIdUnavailable(KeydispenserError):
    """This process holds no live machine-ID lease for a snowflake type right now (not
    yet acquired, lost, or its recorded time is behind the clock): nothing is minted (503)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"no machine ID held for '{name}' right now ({reason}); retry later")
        self.name = name
        self.reason = reason
        self.retry_after_s = 1


class SnowflakeTimeExhausted(KeyspaceExhausted):
    """The time field of a snowflake type is full: its epoch is too far in the past."""

    def __init__(self, name: str) -> None:
        KeydispenserError.__init__(
            self, f"keyspace of '{name}' is exhausted: its time field is full (epoch too old)"
        )
        self.name = name


class NoMachineIdFree(KeydispenserError):
    """No machine ID of a lease pool could be granted: every ID of the range is held, or
    the Redis server changed identity and grants wait one lease TTL (docs/leases.md)."""

    def __init__(
        self, pool: str, lo: int, hi: int, detail: str, settling_s: float | None = None
    ) -> None:
        super().__init__(f"no machine ID free in [{lo}, {hi}] of pool '{pool}': {detail}")
        self.pool = pool
        self.lo = lo
        self.hi = hi
        # Seconds until grants resume when the fence took over recently (an expected
        # wait after a failover, a restart or first use); None otherwise.
        self.settling_s = settling_s

"""keygen and keysync: how often they look, how much they move at a time."""

from __future__ import annotations

from pydantic import Field

from shared.domain.config.base import Strict

# How long keysync's ledger loop blocks on the stream for a batch before its next turn
# (each turn starts with the ledger's watch: ``keysync.ledger.LedgerDrain.watch``).
LEDGER_READ_BLOCK_S = 0.5


class KeysyncConfig(Strict):
    poll_interval_s: float = Field(default=0.5, gt=0)
    # How long a batch whose push got no answer is retried (on the same server only),
    # judged by that server's clock: a keysync paused longer never pushes it again.
    push_retry_s: float = Field(default=10.0, gt=0, le=3_600)
    # How long a take's transaction may sit open and idle (the next batch, held while the
    # previous one is pushed) before PostgreSQL ends it: a keysync frozen or cut off
    # there cannot hold the sync clock's lock, and every other take and lease, longer.
    take_idle_limit_s: float = Field(default=10.0, gt=1, le=600)
    # How long a pushed batch's marker (which makes a retried push add nothing) lives
    # at least; always past the batch's push deadline. Redis memory, one small key each.
    batch_marker_ttl_s: float = Field(default=3_600.0, ge=1, le=7 * 86_400)
    # Ledger events moved from Redis to PostgreSQL per transaction.
    ledger_batch: int = Field(default=1_000, ge=1, le=100_000)
    # Ledger entries another keysync read but never acknowledged (it died) are taken
    # over after this long.
    ledger_claim_idle_s: float = Field(default=30.0, ge=0)
    # A "used" mark applied before its key's issue entry waits this long for it, then
    # is forgotten (and logged): the key was never issued, or Redis lost its entry.
    ledger_early_mark_ttl_s: float = Field(default=7 * 86_400, ge=60)
    # What each ledger transaction wrote is kept this long in Redis (the ledger log): a
    # PostgreSQL promotion that lost at most this much of the ledger's last commits is
    # restored from it; one that lost more halts the ledger (set it above the standby's
    # worst lag plus the time a failover takes). With a ledger type, at least the fence's
    # detection time (``Settings.promotion_detected_s``), or refused at start.
    ledger_retain_s: float = Field(default=300.0, ge=0, le=86_400)
    # How often keysync's ledger loop asks PostgreSQL whether its history is still the
    # record's (a promotion with no traffic is fenced, and restored, within this).
    ledger_watch_s: float = Field(default=1.0, gt=0, le=60)
    # How often released keys due back in the cold table (reissue_released), and
    # "used" marks that waited too long, are looked for.
    ledger_requeue_every_s: float = Field(default=60.0, ge=0.1, le=3_600)
    # Prometheus metrics over HTTP; None: not served.
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=None, ge=0, le=65535)


class KeygenConfig(Strict):
    poll_interval_s: float = Field(default=2.0, gt=0)
    # Candidates generated and committed at a time (a range is several slices).
    slice_size: int = Field(default=1_048_576, ge=1_000)
    # Generation threads; None: one per CPU.
    threads: int | None = Field(default=None, ge=1, le=64)
    # Prometheus metrics over HTTP; None: not served.
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=None, ge=0, le=65535)

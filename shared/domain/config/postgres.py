"""PostgreSQL: where the cold tier, the ledger and the sequences live, and its fence."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# How connections reach PostgreSQL: directly, or through a pooler (PgBouncer) that pins a
# server connection to a client for its session, or lends one per transaction.
Pooler = Literal["none", "session", "transaction"]


class PostgresSettings(BaseModel):
    """The top-level settings of PostgreSQL (part of ``Settings``)."""

    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/keydispenser"
    # The PostgreSQL fence (docs/reliability.md). Switch it off only to show the hazard
    # it closes (`keydispenser drill --no-postgres-fence`): a failover to an asynchronous
    # replica then dispenses keys twice.
    postgres_fence: bool = True
    # Seconds each host of postgres_dsn may take to accept a connection: a frozen host
    # listed first in a multi-host DSN costs this long, then the next is tried.
    postgres_connect_timeout_s: float = Field(default=5.0, gt=0, le=300)
    # What stands between the processes and PostgreSQL (docs/operations.md, "PgBouncer"):
    # none; a pooler in session mode (no startup parameters, no named prepared
    # statements); or one in transaction mode (as session, and keygen polls instead of
    # LISTENing for keysync's wake-ups). A process started with "none" or "session" that
    # finds its connections pooled per transaction refuses to start, naming this setting.
    postgres_pooler: Pooler = "none"
    # The process roles migrate grants their privileges to: <prefix>_keygen,
    # <prefix>_keysync, <prefix>_dispenser, <prefix>_status (deploy/postgres/roles.sql
    # creates them with the same prefix): two environments sharing a server each have
    # their own.
    postgres_role_prefix: str = Field(default="kd", pattern=r"^[a-z][a-z0-9_]{0,30}$")

"""PostgreSQL: where the cold tier, the ledger and the sequences live, and its fence."""

from __future__ import annotations

from pydantic import BaseModel, Field


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
    # The process roles migrate grants their privileges to: <prefix>_keygen,
    # <prefix>_keysync, <prefix>_dispenser, <prefix>_status (deploy/postgres/roles.sql
    # creates them with the same prefix): two environments sharing a server each have
    # their own.
    postgres_role_prefix: str = Field(default="kd", pattern=r"^[a-z][a-z0-9_]{0,30}$")

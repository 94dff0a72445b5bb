from __future__ import annotations

from shared.stores.postgres.databases import database_of, dsn_with_database


def test_dsn_with_database_keeps_credentials_and_options() -> None:
    dsn = "postgresql://kd:s3cret@db.internal:5433/postgres?sslmode=require"
    other = dsn_with_database(dsn, "kd_bench_1")
    assert other == "postgresql://kd:s3cret@db.internal:5433/kd_bench_1?sslmode=require"
    assert database_of(other) == "kd_bench_1"
    assert database_of("postgresql://h/my%20db") == "my db"

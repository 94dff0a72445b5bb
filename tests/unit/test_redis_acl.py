"""The Redis ACL users come from one table (shared/stores/redis/acl.py): the committed
file is its rendering, every key pattern stays in its namespace, and no process user is
granted what no process needs. tests/acceptance/test_redis_acl.py tries them on a real
Redis."""

from __future__ import annotations

import hashlib
from pathlib import Path

from shared.domain.config import Settings, load_settings
from shared.stores.redis.acl import PROCESS_USERS, USERS, acl_file, commands_of, rules
from tests.conftest import EMPTY_CONFIG, small_types

COMMITTED = Path(__file__).resolve().parents[2] / "deploy" / "redis" / "users.acl"
# What no process of keydispenser ever needs: the list, and the rest of the
# server's administration.
NEVER = {
    "flushall",
    "flushdb",
    "config|get",
    "config|set",
    "keys",
    "scan",
    "script|flush",
    "debug",
    "shutdown",
    "monitor",
    "acl|setuser",
    "client|kill",
    "replicaof",
    "slaveof",
    "save",
    "bgsave",
    "eval",
}


def settings(**overrides: object) -> Settings:
    return load_settings(EMPTY_CONFIG, **overrides)


def test_the_committed_file_is_the_table_rendered_for_the_default_namespace() -> None:
    assert COMMITTED.read_text() == acl_file(settings())


def test_a_process_user_names_only_its_namespace_and_deletes_only_its_families() -> None:
    for ns in ("kd", "kd-staging"):
        for user in USERS:
            line = rules(user, settings(redis_namespace=ns))
            patterns = [w.strip("()") for w in line.split() if w.lstrip("(").startswith("~")]
            assert all(p.startswith(f"~{ns}:") for p in patterns), line
            if user.process in PROCESS_USERS:
                assert f"~{ns}:*" in patterns
                # Whole keys are deleted only inside a selector, under named families.
                assert "+del" not in line.split("(")[0] and "+unlink" not in line.split("(")[0]


def test_no_process_user_is_granted_what_no_process_needs() -> None:
    """(Sentinel's own user is given what Sentinel needs: REPLICAOF, CLIENT KILL.)"""
    for user in (u for u in USERS if u.process in PROCESS_USERS):
        granted = commands_of(user, settings())
        assert not granted & NEVER, (user.process, granted & NEVER)


def test_on_a_cluster_the_patterns_are_the_namespaces_hash_tags() -> None:
    cluster = settings(redis_cluster={"nodes": ["127.0.0.1:7000"], "slot_per": "type"})
    line = rules(USERS[0], cluster)
    assert "~{kd}:*" in line and "~{kd.*}:*" in line and "~kd:*" not in line


def test_waitaof_only_for_a_dispenser_whose_types_wait_for_it() -> None:
    types = small_types()
    dispenser = next(u for u in USERS if u.process == "dispenser")
    assert "waitaof" not in commands_of(dispenser, settings(id_types=types))
    types["farmer"] |= {"ledger": True, "ledger_durability": "fsynced", "ledger_wait_ms": 1_500}
    assert "waitaof" in commands_of(dispenser, settings(id_types=types))


def test_passwords_are_written_as_their_hashes() -> None:
    text = acl_file(settings(), {"kd-keygen": "s3cret"})
    digest = hashlib.sha256(b"s3cret").hexdigest()
    (keygen,) = [line for line in text.splitlines() if line.startswith("user kd-keygen ")]
    assert f"#{digest}" in keygen and "s3cret" not in text
    assert all(f"#{digest}" not in line for line in text.splitlines() if line != keygen)

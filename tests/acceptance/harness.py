"""Spawning the real `keydispenser` processes for acceptance tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from keydispenser_ops.drill.postgres import PostgresPair
from keydispenser_ops.processes import cli_command, scrubbed_env, serving, spawn, stop_processes
from shared.domain.apikeys import digest
from shared.domain.config import Settings


def process_env(settings: Settings, config_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a child: its whole configuration comes from KD_ variables."""
    assert settings.permutation_key is not None
    return (
        scrubbed_env(
            KD_CONFIG=str(config_path),
            KD_POSTGRES_DSN=settings.postgres_dsn,
            KD_POSTGRES_POOLER=settings.postgres_pooler,
            KD_REDIS_URL=settings.redis_url,
            KD_PERMUTATION_KEY=settings.permutation_key.get_secret_value(),
            # Part of the fence's detection time a short ledger log is checked against.
            KD_POSTGRES_CONNECT_TIMEOUT_S=str(settings.postgres_connect_timeout_s),
        )
        | extra
    )


def write_config(settings: Settings, path: Path) -> Path:
    """The settings' ID types and loop timings as a YAML (JSON is valid YAML) file."""
    body = settings.model_dump(mode="json", include={"id_types", "keygen", "keysync", "dispenser"})
    path.write_text(json.dumps(body))
    return path


@dataclass
class ChildProcesses:
    """Child processes of one test; every one is ended when the test ends."""

    log_dir: Path
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, command: str, env: dict[str, str], tag: str) -> subprocess.Popen[bytes]:
        child = spawn(cli_command(command), env, self.log_dir / f"{tag}.log")
        self.children.append(child)
        return child

    def close(self) -> None:
        stop_processes(self.children)


def wait_for_http(url: str, timeout_s: float = 20) -> None:
    assert serving(url, timeout_s), f"{url} did not answer within {timeout_s}s"


# --- MOSIP's UIN type on a ledger, and a PostgreSQL primary with its replica -----------


def uin_ledger_type(**extra: object) -> dict[str, object]:
    """The UIN type the ledger's failover tests run: 10 digits, MOSIP's filters, a
    ledger, small tiers (``extra`` adds or replaces fields)."""
    return {
        "kind": "numeric",
        "length": 10,
        "filter_profile": "mosip",
        "ledger": True,
        "range_size": 1_000,
        "hot": {"low": 1, "high": 5},
        "cold": {"low": 2, "high": 10},
        "sync_batch": 5,
    } | extra


def mosip_dispenser(uin: str, wait_s: float, keys: dict[str, str]) -> dict[str, object]:
    """The dispenser section: MOSIP's API on ``uin`` (a PUT waits ``wait_s``), an API
    key per client of ``keys`` (name -> key; the one named 'auditor' may read the
    ledger)."""
    return {
        "mosip": {"uin": uin, "ledger_wait_s": wait_s},
        "auth": {
            "api_keys": [
                {"name": name, "sha256": digest(key), "ledger_admin": name == "auditor"}
                for name, key in keys.items()
            ]
        },
    }


@contextlib.contextmanager
def postgres_pair(prefix: str) -> Iterator[PostgresPair]:
    """A PostgreSQL primary and its streaming replica in a scratch directory (a test
    module's fixture)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.chmod(tmp, 0o755)  # PostgreSQL runs unprivileged when we are root
        servers = PostgresPair(Path(tmp))
        servers.start()
        try:
            yield servers
        finally:
            servers.stop()

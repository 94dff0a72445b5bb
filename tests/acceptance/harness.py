"""Spawning the real `keydispenser` processes for acceptance tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from shared.domain.settings import Settings
from shared.ops.processes import serving, stop_processes


def process_env(settings: Settings, config_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a child: its whole configuration comes from KD_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KD_")}
    assert settings.permutation_key is not None
    env.update(
        KD_CONFIG=str(config_path),
        KD_POSTGRES_DSN=settings.postgres_dsn,
        KD_REDIS_URL=settings.redis_url,
        KD_PERMUTATION_KEY=settings.permutation_key.get_secret_value(),
    )
    env.update(extra)
    return env


def write_config(settings: Settings, path: Path) -> Path:
    """The settings' ID types and loop timings as a YAML (JSON is valid YAML) file."""
    body = settings.model_dump(mode="json", include={"id_types", "keygen", "keysync", "dispenser"})
    path.write_text(json.dumps(body))
    return path


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shared.ops.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Stack:
    """Child processes of one test; every one is ended when the test ends."""

    log_dir: Path
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def spawn(self, command: str, env: dict[str, str], tag: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{tag}.log").open("ab")
        self._logs.append(log)
        child = subprocess.Popen(
            [sys.executable, "-m", "shared.ops.cli", command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.children.append(child)
        return child

    def close(self) -> None:
        stop_processes(self.children)
        for log in self._logs:
            log.close()


def wait_for_http(url: str, timeout_s: float = 20) -> None:
    assert serving(url, timeout_s), f"{url} did not answer within {timeout_s}s"

"""Where the servers are: the stack ``keydispenser up`` runs, or what the user named.

``up`` writes the connection details of the stack it runs into its data directory
(``stack.env``, mode 0600, shell syntax: ``set -a; . .keydispenser/stack.env`` works
too) and its own process ID beside it; it removes both when it stops. Every other
command run in that directory (or given ``--data-dir``/``--env-file``) takes those
settings, under any the user set in the environment.

A command that would reach a server nobody named (no ``KD_*`` variable, no
configuration file naming it, no running ``up`` stack) refuses and says how to name
one, rather than write to whatever listens on 127.0.0.1's default ports.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from shared.domain.config.settings import CREDENTIALS_DIRECTORY
from shared.domain.errors import ConfigError
from shared.runtime import pid_alive

DEFAULT_DATA_DIR = Path(".keydispenser")
STACK_FILE = "stack.env"
PID_FILE = "up.pid"
# The settings that name each store, as variables and as configuration keys.
STORE_VARIABLES = {
    "postgres": ("KD_POSTGRES_DSN",),
    "redis": ("KD_REDIS_URL", "KD_REDIS_SENTINEL", "KD_REDIS_CLUSTER"),
}
STORE_KEYS = {
    "postgres": ("postgres_dsn",),
    "redis": ("redis_url", "redis_sentinel", "redis_cluster"),
}
STORE_NAMES = {"postgres": "PostgreSQL", "redis": "Redis"}
EXAMPLES = {
    "postgres": "KD_POSTGRES_DSN=postgresql://USER@HOST:5432/DATABASE",
    "redis": "KD_REDIS_URL=redis://HOST:6379/0",
}


def write(data_dir: Path, values: Mapping[str, str]) -> Path:
    """``stack.env`` (0600, atomically) and ``up.pid`` in ``data_dir``."""
    for key, value in values.items():
        if "\n" in value or "\r" in value:
            raise ConfigError(f"{key}: a value on several lines cannot go into {STACK_FILE}")
    lines = [
        "# The stack `keydispenser up` runs (removed when it stops). Every keydispenser",
        "# command run in the directory above this one uses these settings; a shell can",
        "# too: set -a; . " + str(data_dir / STACK_FILE) + "; set +a",
        *(f"{key}={shlex.quote(value)}" for key, value in values.items()),
    ]
    path = data_dir / STACK_FILE
    fd, temporary = tempfile.mkstemp(dir=data_dir, prefix=".stack-")  # 0600
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(temporary, path)
    (data_dir / PID_FILE).write_text(f"{os.getpid()}\n")
    return path


def claim(data_dir: Path) -> None:
    """``up.pid`` alone, written before ``up`` starts anything (``--purge`` and the
    commands run beside it see a running stack from then on)."""
    (data_dir / PID_FILE).write_text(f"{os.getpid()}\n")


def remove(data_dir: Path, names: tuple[str, ...] = (STACK_FILE, PID_FILE)) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (data_dir / name).unlink()


@dataclass(frozen=True)
class Stack:
    """A ``stack.env`` found, whether its ``up`` still runs, and its settings."""

    path: Path
    values: dict[str, str]
    running: bool


def find(env_file: str | None, data_dir: str | None) -> Stack | None:
    """The stack file named (``--env-file``, ``--data-dir``) or in ``./.keydispenser``."""
    if env_file:
        path = Path(env_file)
        if not path.is_file():
            raise ConfigError(f"--env-file: file not found: {env_file}")
    else:
        path = Path(data_dir or DEFAULT_DATA_DIR) / STACK_FILE
        if not path.is_file():
            if data_dir:
                raise ConfigError(
                    f"--data-dir: no {STACK_FILE} in {data_dir}: is `keydispenser up "
                    f"--data-dir {data_dir}` running?"
                )
            return None
    return Stack(path, _parse(path), up_running(path.parent / PID_FILE))


def _parse(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, raw = line.partition("=")
            values[key.strip()] = " ".join(shlex.split(raw))
    return values


def up_running(pid_file: Path) -> bool:
    """Whether the ``up`` that wrote the stack file is still running (no pid file, as
    for a file written by hand: taken to be)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return True
    return pid_alive(pid)


def apply(stack: Stack, environ: MutableMapping[str, str]) -> None:
    """The stack's settings, under whatever the environment already sets."""
    for key, value in stack.values.items():
        environ.setdefault(key, value)


def named_stores(config_path: str | None, environ: Mapping[str, str]) -> set[str]:
    """The stores the user named: by a ``KD_*`` variable, or in their own configuration
    file (not the built-in default)."""
    named = {store for store, names in STORE_VARIABLES.items() if any(n in environ for n in names)}
    credentials = environ.get(CREDENTIALS_DIRECTORY)  # systemd's LoadCredential= files
    if credentials:
        named |= {
            store
            for store, names in STORE_VARIABLES.items()
            if any((Path(credentials) / n).is_file() for n in names)
        }
    path = config_path or environ.get("KD_CONFIG")
    if path and Path(path).is_file():
        with contextlib.suppress(yaml.YAMLError, OSError):
            body = yaml.safe_load(Path(path).read_text()) or {}
            if isinstance(body, dict):
                named |= {s for s, keys in STORE_KEYS.items() if any(k in body for k in keys)}
    return named


def require_named(
    command: str, needs: set[str], named: set[str], stale: Stack | None, beside_up: bool = True
) -> None:
    """ConfigError naming how to point ``command`` at the stores it needs and nobody
    named (never a silent 127.0.0.1). ``beside_up``: the command may use a running
    ``up``'s stack file found in the working directory (the processes may not)."""
    missing = [store for store in ("postgres", "redis") if store in needs - named]
    if not missing:
        return
    what = " and ".join(STORE_NAMES[s] for s in missing)
    if stale is not None:
        why = (
            f"{stale.path} names the stack `keydispenser up` ran, which is not running: "
            "start it again (`make up`)"
        )
    elif not beside_up:
        why = (
            "a long-running process reads a running `keydispenser up`'s stack only when "
            "it is named (--data-dir DIR or --env-file FILE)"
        )
    else:
        why = "start the whole stack with `make up` and run this in the same directory"
    examples = ", ".join(EXAMPLES[s] for s in missing)
    raise ConfigError(
        f"{command}: no {what} named; {why}, or name it: {examples} "
        "(or the same in a --config file)"
    )

"""Builds the lease library under its own name, ``keydispenser_leases``: the server's
files (``shared/`` in the repository, the one copy there is) with ``shared`` renamed in
their imports and resource names, so that the library installs no package named
``shared`` into the applications that use it.

From the repository (``python -m build clients/leases``, ``pip install clients/leases``)
the hook writes the renamed files and includes them; the sdist it makes holds them
already, and a wheel built from that sdist finds them in place (the repository's
``shared/`` is not there to read)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # loaded for write_package alone (the docs' test), without hatchling
    BuildHookInterface = object

PACKAGE = "keydispenser_leases"
# The library's files in the repository's shared/: the holder, its Redis calls and
# scripts, the Redis access and fence prologue they run on, and the domain they use.
FILES = (
    "py.typed",
    "domain/__init__.py",
    "domain/config/__init__.py",
    "domain/config/base.py",
    "domain/config/redis.py",
    "domain/errors.py",
    "domain/leases.py",
    "domain/names.py",
    "domain/redis_keys.py",
    "stores/__init__.py",
    "stores/redis/__init__.py",
    "stores/redis/endpoint.py",
    "stores/redis/scripts.py",
    "stores/redis/script_line.py",
    "stores/fence/__init__.py",
    "stores/fence/lua/fence.lua",
    "stores/fence/lua/sync_record.lua",
    "stores/ledger/__init__.py",
    "stores/ledger/lua/ledger.lua",
    "leases/__init__.py",
    "leases/holder.py",
    "leases/store.py",
)
FOLDERS = ("leases/lua",)
# The package's own __init__: what an application imports.
INIT = '''"""Machine-ID leases in Redis for Snowflake IDs, as keydispenser leases them
(docs/leases.md in keydispenser's repository)."""

from keydispenser_leases.domain.errors import ConfigError, NoMachineIdFree, StoreUnavailable
from keydispenser_leases.leases.holder import (
    LeaseMetrics,
    MachineLease,
    SyncMachineLease,
    lease_machine_id,
)
from keydispenser_leases.leases.store import MachineLeases
from keydispenser_leases.stores.redis.endpoint import RedisEndpoint

__all__ = [
    "ConfigError",
    "LeaseMetrics",
    "MachineLease",
    "MachineLeases",
    "NoMachineIdFree",
    "RedisEndpoint",
    "StoreUnavailable",
    "SyncMachineLease",
    "lease_machine_id",
]
'''
# ``shared`` as a module name: in imports and in dotted resource names ("shared.leases").
_NAME = re.compile(r"(?<![\w.])shared(?=\.[a-z_])|(?<=from )shared(?= import)")


def renamed(text: str) -> str:
    return _NAME.sub(PACKAGE, text)


def write_package(source: Path, out: Path) -> Path:
    """The library's package under ``out`` from the repository's ``source`` (its
    shared/), renamed; returns the package's folder."""
    package = out / PACKAGE
    paths = [Path(f) for f in FILES]
    for folder in FOLDERS:
        paths += [p.relative_to(source) for p in (source / folder).rglob("*") if p.is_file()]
    for relative in paths:
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative.suffix == ".py":
            target.write_text(renamed((source / relative).read_text()))
        else:
            shutil.copyfile(source / relative, target)
    (package / "__init__.py").write_text(INIT)
    return package


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        source = root.parent.parent / "shared"
        if (root / PACKAGE).is_dir() or not source.is_dir():
            return  # built from the sdist: the renamed files are in place
        package = write_package(source, Path(tempfile.mkdtemp(prefix="kd-leases-")))
        build_data["force_include"][str(package)] = PACKAGE

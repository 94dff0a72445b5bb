"""The server's wheel carries the runtime, whole: the three processes, the command line,
the stores and the domain, with their Lua, SQL and default configuration. Prints what it
holds; exits 1 when a file the runtime needs is missing."""

from __future__ import annotations

import sys
import zipfile
from collections import Counter

REQUIRED = (
    "shared/cli/main.py",
    "shared/stores/hot/lua/pop.lua",
    "shared/stores/fence/lua/fence.lua",
    "shared/stores/ledger/lua/ledger.lua",
    "shared/leases/lua/lease_acquire.lua",
    "shared/stores/postgres/migrations/0001_initial.sql",
    "shared/domain/default.yaml",
    "keygen/main.py",
    "keysync/main.py",
    "dispenser/app.py",
)


def main(path: str) -> int:
    names = zipfile.ZipFile(path).namelist()
    tops = Counter(name.split("/")[0] for name in names)
    print(f"{path}: {len(names)} files: " + ", ".join(f"{t} {n}" for t, n in sorted(tops.items())))
    missing = [name for name in REQUIRED if name not in names]
    for name in missing:
        print(f"missing: {name}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Secrets written to files: `keydispenser secret --out`, and `up`'s permutation key."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_secret(path: Path, text: str) -> None:
    """Create ``path`` holding ``text``, mode 0600, atomically: readers see no file or the
    whole secret, never a partial or group-readable one; the first writer wins."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # 0600
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
        os.close(fd)
        with contextlib.suppress(FileExistsError):  # another `up` created it first
            os.link(temporary, path)
    finally:
        os.unlink(temporary)

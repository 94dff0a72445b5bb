"""`keydispenser up` keeps the secret it creates private from its first byte."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from keydispenser_ops.up import permutation_key, prepare_data_dir
from shared.domain.config import Settings
from tests.conftest import EMPTY_CONFIG


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def keyless() -> Settings:
    from shared.domain.config import load_settings

    return load_settings(EMPTY_CONFIG, permutation_key=None)


def test_the_permutation_key_is_0600_in_a_0700_directory(tmp_path: Path, keyless: Settings) -> None:
    data_dir = tmp_path / "data"
    old_umask = os.umask(0o022)
    try:
        prepare_data_dir(data_dir)
        key = permutation_key(keyless, data_dir)
    finally:
        os.umask(old_umask)
    path = data_dir / "secrets" / "permutation.key"
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert mode(data_dir) == (0o711 if os.geteuid() == 0 else 0o700)
    assert len(key) >= 48 and path.read_text() == key
    assert permutation_key(keyless, data_dir) == key  # kept: it defines the keyspace
    assert [p.name for p in path.parent.iterdir()] == ["permutation.key"]  # no temp left


def test_a_key_from_an_earlier_layout_is_kept_and_tightened(
    tmp_path: Path, keyless: Settings
) -> None:
    legacy = tmp_path / "permutation.key"
    legacy.write_text("earlier-secret\n")
    legacy.chmod(0o644)
    assert permutation_key(keyless, tmp_path) == "earlier-secret"
    assert mode(legacy) == 0o600

"""The acceptance tests share the integration fixtures' servers (one start per session)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import FIXTURES


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin(FIXTURES)

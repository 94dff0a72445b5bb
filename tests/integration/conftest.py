"""The integration tests run on real servers: the fixtures of
tests/integration/fixtures.py, registered as a plugin (once per session, however many
directories ask for it, so each worker starts its servers once)."""

from __future__ import annotations

import pytest

FIXTURES = "tests.integration.fixtures"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin(FIXTURES)

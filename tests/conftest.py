"""What every test shares: the Hypothesis profile and the test configuration's constants.

Light on purpose (the standard library, pytest's Hypothesis and pure helpers): a unit test
loads no server, driver or app it does not use. The real servers, the per-test databases
and the dispenser over HTTP are the integration fixtures (tests/integration/fixtures.py),
which tests/integration/conftest.py and tests/acceptance/conftest.py register."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hypothesis

# Tests never assert speed: Hypothesis's per-example deadline (200 ms) would, and fails
# on a loaded machine.
hypothesis.settings.register_profile("keydispenser", deadline=None)
hypothesis.settings.load_profile("keydispenser")

TEST_SECRET = "test-permutation-secret"
EMPTY_CONFIG = Path(__file__).parent / "empty.yaml"
NS = "kd"  # the default redis_namespace, which make_settings keeps


def small_types() -> dict[str, Any]:
    """The default types with watermarks small enough for tests."""
    marks = {
        "range_size": 20_000,
        "hot": {"low": 200, "high": 1_000},
        "cold": {"low": 2_000, "high": 8_000},
        "sync_batch": 500,
    }
    return {
        "farmer": {"kind": "numeric", "length": 10, **marks},
        "shortlink": {"kind": "base62", "length": 7, **marks},
    }

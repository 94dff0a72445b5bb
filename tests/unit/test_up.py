"""What ``keydispenser up`` tells the operator once the stack serves."""

from __future__ import annotations

from shared.domain.settings import Settings
from shared.ops.up import greeting

BASE = "http://127.0.0.1:8080"


def test_the_request_to_try_uses_the_first_configured_type() -> None:
    numeric = {"kind": "numeric", "length": 10}
    settings = Settings.model_validate({"id_types": {"member": numeric, "farmer": numeric}})
    assert greeting(settings, BASE).splitlines() == [
        f"keydispenser is up: {BASE}  (Ctrl-C stops everything)",
        f"  try: curl -X POST {BASE}/v1/idgenerator/member/id",
    ]


def test_without_a_type_there_is_no_request_to_try() -> None:
    assert "try:" not in greeting(Settings.model_validate({"id_types": {}}), BASE)

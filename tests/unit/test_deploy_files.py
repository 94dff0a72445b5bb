"""The files for running keydispenser without Kubernetes, checked as their tools would
(`docker compose config`, `systemd-analyze verify`), without those tools: every
reference resolves, every setting is one keydispenser knows, every command is one it
runs, and the order (migrate first) holds."""

from __future__ import annotations

import configparser
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.domain.config import Settings
from shared.ops.cli import parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
SYSTEMD = DEPLOY / "systemd"
TOP_LEVEL = {"name", "services", "volumes", "networks", "secrets", "configs"}
SERVICE_KEYS = {
    "image", "command", "environment", "depends_on", "ports", "volumes", "healthcheck",
    "restart", "env_file", "networks", "secrets", "user", "entrypoint",
}  # fmt: skip
RESTART = {"no", "always", "on-failure", "unless-stopped"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
INTERPOLATION = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(:?[-?][^}]*)?\}")


def setting_exists(variable: str) -> bool:
    """Whether a KD_ variable names a setting (KD_A__B: field a, then its field b)."""
    model: Any = Settings
    for part in variable.removeprefix("KD_").lower().split("__"):
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return False
        model = fields[part].annotation
        model = next(
            (a for a in getattr(model, "__args__", ()) if hasattr(a, "model_fields")), model
        )
    return True


def keydispenser_command(argv: list[str]) -> None:
    """The arguments parse as a keydispenser command (argparse exits otherwise)."""
    parser().parse_args(argv)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return body


def test_compose_file_is_well_formed(compose: dict[str, Any]) -> None:
    assert set(compose) <= TOP_LEVEL | {"x-keydispenser"}
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "keygen", "keysync", "dispenser"}
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        assert service["image"] and service.get("restart", "no") in RESTART
        for target, how in service.get("depends_on", {}).items():
            assert target in services and how["condition"] in CONDITIONS, (name, target)
        for volume in service.get("volumes", []):
            assert volume.split(":", 1)[0] in compose["volumes"], (name, volume)
        if "healthcheck" in service:
            assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    for text in re.findall(r"\$\{[^}]*\}", COMPOSE.read_text()):
        assert INTERPOLATION.fullmatch(text), text


def test_compose_runs_keydispenser_as_the_docs_say(compose: dict[str, Any]) -> None:
    services = compose["services"]
    ours = {"migrate", "keygen", "keysync", "dispenser"}
    for name in ours:
        service = services[name]
        keydispenser_command(service["command"])
        assert service["command"] == [name]
        for variable in service["environment"]:
            assert setting_exists(variable), variable
    # migrate first, then every process; Redis never evicts and keeps its stream.
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ours - {"migrate"}:
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
    flags = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy noeviction" in flags and "--appendonly yes" in flags
    assert "--enable-debug-command no" in flags


def units() -> dict[str, configparser.ConfigParser]:
    found = {}
    for path in sorted(SYSTEMD.glob("*.service")):
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.optionxform = str  # type: ignore[assignment,method-assign]
        unit.read(path)
        found[path.stem] = unit
    return found


def test_systemd_units_run_keydispenser_after_migrate() -> None:
    found = units()
    assert set(found) == {
        f"keydispenser-{t}" for t in ("migrate", "keygen", "keysync", "dispenser")
    }
    for name, unit in found.items():
        assert {"Unit", "Service", "Install"} <= set(unit.sections())
        program, *argv = unit["Service"]["ExecStart"].split()
        assert program.endswith("/keydispenser")
        keydispenser_command(argv)
        assert unit["Service"]["EnvironmentFile"] == "/etc/keydispenser/keydispenser.env"
        if name != "keydispenser-migrate":
            assert unit["Unit"]["Requires"] == "keydispenser-migrate.service"
            assert "keydispenser-migrate.service" in unit["Unit"]["After"]
    assert found["keydispenser-migrate"]["Service"]["Type"] == "oneshot"


def test_the_environment_file_names_only_settings() -> None:
    for line in (SYSTEMD / "keydispenser.env").read_text().splitlines():
        if line and not line.startswith("#"):
            variable = line.split("=", 1)[0]
            assert variable == "KD_CONFIG" or setting_exists(variable), variable


def test_a_misspelt_variable_is_told_apart() -> None:
    """Control: the check refuses what keydispenser would not know."""
    assert setting_exists("KD_DISPENSER__PORT") and setting_exists("KD_REDIS_URL")
    assert not setting_exists("KD_DISPENSR__PORT") and not setting_exists("KD_REDIS__URL")

"""The files for running keydispenser without Kubernetes, checked as their tools would
(`docker compose config`, `systemd-analyze verify`), without those tools: every
reference resolves, every setting is one keydispenser knows, every command is one it
runs, the order (migrate first) holds, and each process gets only its own secrets:
the permutation key reaches migrate and keygen alone, each process connects as its
own PostgreSQL role (deploy/postgres/roles.sql), the API is published on loopback."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from shared.cli.main import parser
from shared.domain.config import Settings, load_settings
from tests.conftest import TEST_SECRET

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
REDIS_ACL = DEPLOY / "redis" / "users.acl"
REDIS_USERS = "redis-users.acl"  # what init-env.sh makes of it
SYSTEMD = DEPLOY / "systemd"
TOP_LEVEL = {"name", "services", "volumes", "networks", "secrets", "configs"}
SERVICE_KEYS = {
    "image", "command", "environment", "depends_on", "ports", "volumes", "healthcheck",
    "restart", "env_file", "networks", "secrets", "user", "entrypoint", "expose",
    "read_only", "security_opt", "cap_drop", "profiles",
}  # fmt: skip
RESTART = {"no", "always", "on-failure", "unless-stopped"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
INTERPOLATION = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(:?[-?][^}]*)?\}")
OURS = ("migrate", "keygen", "keysync", "dispenser")
# Each process's PostgreSQL role (roles.sql), and who may hold the permutation key.
ROLES = {
    "migrate": "kd_owner",
    "keygen": "kd_keygen",
    "keysync": "kd_keysync",
    "dispenser": "kd_dispenser",
    "status": "kd_status",
}
KEY_HOLDERS = {"migrate", "keygen"}
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "ProtectProc": "invisible",
    "PrivateTmp": "yes",
    "UMask": "0077",
    "CapabilityBoundingSet": "",
}


def setting_exists(variable: str) -> bool:
    """Whether a KD_ variable names a setting (KD_A__B: field a, then its field b), or
    is KD_CONFIG (the file the settings come from)."""
    if variable == "KD_CONFIG":
        return True
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


def env_file(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            found[name] = value
    return found


def role_of(dsn: str) -> str:
    return urlsplit(dsn).username or ""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # resolves the `<<:` merges
    return body


@pytest.fixture(scope="module")
def compose_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """The env files deploy/compose/init-env.sh writes, per file name (a fresh copy)."""
    work = tmp_path_factory.mktemp("compose") / "compose"
    (work.parent / "redis").mkdir()
    work.mkdir()
    shutil.copy(COMPOSE_DIR / "init-env.sh", work)
    shutil.copy(REDIS_ACL, work.parent / "redis")
    subprocess.run(["sh", str(work / "init-env.sh")], check=True, capture_output=True)
    again = subprocess.run(["sh", str(work / "init-env.sh")], capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr  # never overwrites the key
    files = {path.name: path for path in (work / "env").iterdir()}
    acl = files.pop(REDIS_USERS)  # the Redis server's user reads it: hashes only, 0644
    assert acl.stat().st_mode & 0o777 == 0o644
    for path in files.values():
        assert path.stat().st_mode & 0o077 == 0, path  # 0600
    return {name: env_file(path) for name, path in files.items()} | {
        REDIS_USERS: {"text": acl.read_text()}
    }


def test_compose_file_is_well_formed(compose: dict[str, Any]) -> None:
    assert set(compose) <= TOP_LEVEL | {"x-keydispenser"}
    services = compose["services"]
    assert set(services) == {"postgres", "redis", *OURS, "status", "nginx"}
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        assert service["image"] and service.get("restart", "no") in RESTART
        for target, how in service.get("depends_on", {}).items():
            assert target in services and how["condition"] in CONDITIONS, (name, target)
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./env/"):  # a file init-env.sh writes
                assert source == f"./env/{REDIS_USERS}", (name, volume)
            elif source.startswith("."):  # a file of the repository, mounted
                assert (COMPOSE_DIR / source).resolve().is_file(), (name, volume)
            else:
                assert source in compose["volumes"], (name, volume)
        if "healthcheck" in service:
            assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    for text in re.findall(r"\$\{[^}]*\}", COMPOSE.read_text()):
        assert INTERPOLATION.fullmatch(text), text


def test_compose_runs_keydispenser_as_the_docs_say(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in (*OURS, "status"):
        service = services[name]
        keydispenser_command(service["command"])
        assert service["command"] == [name]
        for variable in service["environment"]:
            assert setting_exists(variable), variable
        assert service["read_only"] and service["cap_drop"] == ["ALL"]
        assert service["environment"]["KD_CONFIG"] == "/etc/keydispenser/keydispenser.yaml"
    # migrate first, then every process; Redis never evicts and keeps its stream.
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in set(OURS) - {"migrate"}:
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
    flags = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy noeviction" in flags and "--appendonly yes" in flags
    assert "--enable-debug-command no" in flags


def test_compose_runs_each_service_as_a_user_of_its_own_and_probes_keygen_and_keysync(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    users = [services[name]["user"] for name in (*OURS, "status")]
    assert len(set(users)) == len(users)  # no process reads another's environment
    assert all(not user.startswith("0") and user != "root" for user in users)
    for name, variable in (
        ("keygen", "KD_KEYGEN__METRICS_PORT"),
        ("keysync", "KD_KEYSYNC__METRICS_PORT"),
    ):
        service = services[name]
        port = service["environment"][variable]
        assert service["expose"] == [port]
        assert f"127.0.0.1:{port}/healthz" in " ".join(service["healthcheck"]["test"])
        host = service["environment"][variable.replace("PORT", "HOST")]
        assert host == "0.0.0.0"  # Prometheus scrapes it over the compose network


def test_compose_gives_each_process_its_role_and_the_key_to_migrate_and_keygen_only(
    compose: dict[str, Any], compose_env: dict[str, dict[str, str]]
) -> None:
    services = compose["services"]
    for name in (*OURS, "status"):
        service = services[name]
        # Nothing secret in the shared part: every credential comes from its env file.
        assert not {"KD_POSTGRES_DSN", "KD_PERMUTATION_KEY"} & set(service["environment"])
        (file,) = service["env_file"]
        values = compose_env[Path(file).name]
        for variable in values:
            assert setting_exists(variable), (name, variable)
        assert role_of(values["KD_POSTGRES_DSN"]) == ROLES[name], name
        assert ("KD_PERMUTATION_KEY" in values) == (name in KEY_HOLDERS), name
    keys = {compose_env[f"{n}.env"]["KD_PERMUTATION_KEY"] for n in KEY_HOLDERS}
    assert len(keys) == 1 and len(keys.pop()) >= 32
    # postgres gets the role passwords (and sets them once roles.sql made the roles),
    # no process does.
    postgres = services["postgres"]
    mounted = " ".join(postgres["volumes"])
    assert "roles.sql:/docker-entrypoint-initdb.d/" in mounted
    assert "postgres-passwords.sh:/docker-entrypoint-initdb.d/" in mounted
    passwords = compose_env["postgres.env"]
    for name, role in ROLES.items():
        dsn = compose_env[f"{name}.env"]["KD_POSTGRES_DSN"]
        assert urlsplit(dsn).password == passwords[f"{role.upper()}_PASSWORD"]


def test_compose_gives_each_process_its_redis_user_and_redis_their_passwords_hashes(
    compose: dict[str, Any], compose_env: dict[str, dict[str, str]]
) -> None:
    """Each service logs in to Redis as its own ACL user (deploy/redis/users.acl, the
    table of shared/stores/redis/acl.py); the server gets the passwords' SHA-256 only,
    and its default user may only PING (the health check)."""
    acl = compose_env[REDIS_USERS]["text"]
    assert "--aclfile" in compose["services"]["redis"]["command"]
    for name in ("keygen", "keysync", "dispenser", "status"):
        url = urlsplit(compose_env[f"{name}.env"]["KD_REDIS_URL"])
        assert url.username == f"kd-{name}" and url.password, name
        digest = hashlib.sha256(url.password.encode()).hexdigest()
        assert f"user kd-{name} on resetpass #{digest} " in acl, name
        assert url.password not in acl
        assert "KD_REDIS_URL" not in compose["services"][name].get("environment", {}), name
    assert acl.endswith("user default on nopass resetkeys resetchannels -@all +ping\n")


def test_compose_publishes_the_api_on_loopback_and_scales_dispensers_behind_nginx(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assert "ports" not in services["dispenser"]  # `--scale dispenser=2` takes no host port
    assert services["dispenser"]["expose"] == ["8080"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert name == "nginx" and port.startswith("127.0.0.1:"), (name, port)
    nginx = (COMPOSE_DIR / "nginx.conf").read_text()
    assert "proxy_pass $dispensers" in nginx and "http://dispenser:8080" in nginx
    assert "proxy_next_upstream off" in nginx  # a popped key is never retried elsewhere


@pytest.mark.parametrize("config", [COMPOSE_DIR, SYSTEMD], ids=["compose", "systemd"])
def test_the_example_configuration_loads(config: Path) -> None:
    settings = load_settings(config / "keydispenser.yaml", permutation_key=TEST_SECRET)
    assert settings.id_types and "uin" in settings.id_types


def unit_file(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit: section -> its (key, value) lines, in order (keys may repeat)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = []
            continue
        key, _, value = line.partition("=")
        sections[current].append((key, value))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit[section] if k == key]


SYSTEMD_UNITS = {
    "keydispenser-migrate": "migrate",
    "keydispenser-keygen": "keygen",
    "keydispenser-keysync": "keysync",
    "keydispenser-dispenser": "dispenser",
    "keydispenser-dispenser@": "dispenser",
    "keydispenser-status": "status",
}
CREDENTIALS = "/etc/keydispenser/credentials"


def test_systemd_units_run_keydispenser_after_migrate_each_as_a_user_of_its_own() -> None:
    found = {p.stem: unit_file(p) for p in sorted(SYSTEMD.glob("*.service"))}
    assert set(found) == set(SYSTEMD_UNITS)
    users = set()
    for name, unit in found.items():
        process = SYSTEMD_UNITS[name]
        assert {"Unit", "Service"} <= set(unit)
        (start,) = values(unit, "Service", "ExecStart")
        program, *argv = start.split()
        assert program.endswith("/keydispenser") and argv == [process]
        keydispenser_command(argv)
        assert values(unit, "Service", "EnvironmentFile") == [
            "/etc/keydispenser/common.env",
            f"/etc/keydispenser/{process}.env",
        ]
        # A user per unit: no unit reads another's /proc/<pid>/environ or credentials.
        assert values(unit, "Service", "DynamicUser") == ["yes"], name
        (user,) = values(unit, "Service", "User")
        users.add((user, process))
        for key, value in HARDENING.items():
            assert values(unit, "Service", key) == [value], (name, key)
        if process not in ("migrate", "status"):
            assert values(unit, "Unit", "Requires") == ["keydispenser-migrate.service"]
            assert "keydispenser-migrate.service" in values(unit, "Unit", "After")[0]
    assert len({user for user, _ in users}) == len({process for _, process in users})
    assert values(found["keydispenser-migrate"], "Service", "Type") == ["oneshot"]
    assert values(found["keydispenser-dispenser@"], "Service", "Environment") == [
        "KD_DISPENSER__PORT=%i"
    ]
    assert "Install" not in found["keydispenser-status"]  # on demand only


def test_systemd_secrets_are_credentials_each_unit_its_own() -> None:
    """Secrets reach a unit as systemd credentials (LoadCredential=, read from
    $CREDENTIALS_DIRECTORY), never as environment variables: the DSN of its own role,
    the permutation key to migrate and keygen alone."""
    for name, process in SYSTEMD_UNITS.items():
        unit = unit_file(SYSTEMD / f"{name}.service")
        loaded = dict(v.split(":", 1) for v in values(unit, "Service", "LoadCredential"))
        expected = {"KD_POSTGRES_DSN": f"{CREDENTIALS}/{process}/KD_POSTGRES_DSN"}
        if process in KEY_HOLDERS:
            expected["KD_PERMUTATION_KEY"] = f"{CREDENTIALS}/KD_PERMUTATION_KEY"
        assert loaded == expected, name
        for variable in loaded:
            assert setting_exists(variable)
        example = SYSTEMD / "credentials" / process / "KD_POSTGRES_DSN.example"
        dsn = example.read_text().strip()
        assert role_of(dsn) == ROLES[process], process
        # A verifying sslmode names its CA: a unit's user has no ~/.postgresql/root.crt.
        assert "sslmode=verify-full" in dsn and "sslrootcert=/" in dsn


def test_systemd_env_files_hold_no_secret_and_expose_every_probe() -> None:
    common = env_file(SYSTEMD / "env" / "common.env.example")
    assert common["KD_CONFIG"] == "/etc/keydispenser/keydispenser.yaml"
    ports = {}
    for process in {*SYSTEMD_UNITS.values()}:
        own = env_file(SYSTEMD / "env" / f"{process}.env.example")
        for variable in [*common, *own]:
            assert setting_exists(variable), variable
            assert variable not in {"KD_POSTGRES_DSN", "KD_PERMUTATION_KEY"}, (process, variable)
        assert "KD_DISPENSER__PORT" not in own  # the template unit's instance sets it
        for variable, value in own.items():
            if variable.endswith("__METRICS_PORT"):
                ports[process] = int(value)
    # keygen's and keysync's probes and /metrics (the dispenser's are on its API port).
    assert set(ports) == {"keygen", "keysync"} and len(set(ports.values())) == 2


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("name", sorted(SYSTEMD_UNITS))
def test_systemd_analyze_rates_each_unit_exposure_low(name: str, tmp_path: Path) -> None:
    """systemd's own assessment of each unit's sandbox (offline: the unit need not be
    installed): exposure at most 2.5 of 10 ("OK"; the units before users and credentials
    rated 3.8)."""
    unit = tmp_path / f"{name}.service"
    unit.write_text((SYSTEMD / f"{name}.service").read_text())
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--threshold=25", str(unit)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr


def test_a_misspelt_variable_is_told_apart() -> None:
    """Control: the check refuses what keydispenser would not know."""
    assert setting_exists("KD_DISPENSER__PORT") and setting_exists("KD_REDIS_URL")
    assert not setting_exists("KD_DISPENSR__PORT") and not setting_exists("KD_REDIS__URL")


ROOT = DEPLOY.parent


def test_the_image_is_built_from_pinned_dependencies_and_without_local_state() -> None:
    ignored = {
        line for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] != "#"
    }
    # The local stack's data holds a permutation key and stack.env; env/ the role passwords.
    assert {".git", ".venv", ".keydispenser", "**/.keydispenser", "deploy/compose/env"} <= ignored
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "-c deploy/constraints.txt ." in dockerfile
    pinned = {
        re.sub(r"[-_.]+", "-", line.split("==")[0]).lower()
        for line in (DEPLOY / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]
        assert re.sub(r"[-_.]+", "-", name).lower() in pinned, requirement
    assert project["license"] in ("Apache-2.0", {"text": "Apache-2.0"})
    assert (ROOT / "LICENSE").read_text().startswith("Apache License")

"""A new user's first hour: `keydispenser up`, then every command from the same
directory with no `KD_*` variable set, and every code block of README.md and docs/.

One stack for the module, as a user starts it: `keydispenser up` on embedded servers in
an empty directory. Commands then find it through `.keydispenser/stack.env`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import serving, types_not_serving
from shared.domain.config import default_config_path, load_settings
from shared.domain.errors import ConfigError

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
UP_DEADLINE_S = 240.0
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy/README.md"]
FENCE = re.compile(r"^```(\S*)\s*$")
SKIP = re.compile(r"<!-- docs-test: skip: (.+?) -->")


def plain_env() -> dict[str, str]:
    """A user's shell: no KD_ variable, keydispenser on PATH (the venv's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KD_")}
    return env | {"PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"}


@dataclass
class Stack:
    home: Path  # the directory `up` ran in
    port: int
    settings: dict[str, str]  # what .keydispenser/stack.env says

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "keydispenser"), *args],
            cwd=cwd or self.home,
            env=plain_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def read_stack_env(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[key] = value.strip("'")
    return found


@contextlib.contextmanager
def running_up(home: Path, env: dict[str, str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """``keydispenser up --port port`` in ``home`` (its output in ``home/up.log``) once
    it serves every type and printed its banner; stopped by Ctrl-C (SIGINT) on exit."""
    log = (home / "up.log").open("w")
    up = subprocess.Popen(
        [str(BIN / "keydispenser"), "up", "--port", str(port)],
        cwd=home,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + UP_DEADLINE_S
        env_file = home / ".keydispenser" / "stack.env"
        while not env_file.exists() and time.monotonic() < deadline and up.poll() is None:
            time.sleep(0.2)
        base = f"http://127.0.0.1:{port}"
        ready = serving(f"{base}/healthz", max(deadline - time.monotonic(), 1))
        waiting = types_not_serving(f"{base}/readyz", max(deadline - time.monotonic(), 1))
        assert ready and not waiting, (home / "up.log").read_text()[-4000:]
        while "keydispenser is up" not in (home / "up.log").read_text():
            assert time.monotonic() < deadline and up.poll() is None, "no banner"
            time.sleep(0.1)
        yield up
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("first-hour")
    os.chmod(home, 0o755)
    port = free_port()
    with running_up(home, plain_env(), port):
        yield Stack(home, port, read_stack_env(home / ".keydispenser" / "stack.env"))


def post(url: str) -> dict[str, object]:
    request = urllib.request.Request(url, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        body: dict[str, object] = json.loads(reply.read())
        return body


def test_up_says_where_its_servers_are_and_what_to_try(stack: Stack) -> None:
    log = (stack.home / "up.log").read_text()
    assert f"keydispenser is up: {stack.base}" in log
    assert stack.settings["KD_POSTGRES_DSN"] in log and stack.settings["KD_REDIS_URL"] in log
    assert ".keydispenser/stack.env" in log and "status" in log
    env_file = stack.home / ".keydispenser" / "stack.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    waited = [line for line in log.splitlines() if line.startswith("keydispenser: ")]
    assert all("keys of events" not in line for line in waited), waited  # it leases


def test_commands_run_beside_up_reach_its_stack(stack: Stack) -> None:
    status = stack.run("status")
    assert status.returncode == 0, status.stderr
    for column in ("hot_depth", "acceptance_rate", "estimated_keys_left"):
        assert column in status.stdout
    assert "farmer" in status.stdout and "postgres fence: ok" in status.stdout

    leased = stack.run(
        "--data-dir", ".keydispenser",  # it wraps a service: only a stack named on purpose
        "lease", "--pool", "demo", "--min", "0", "--max", "3", "--wait", "15", "--",
        "sh", "-c", 'echo "machine $KD_MACHINE_ID"',
    )  # fmt: skip
    assert leased.returncode == 0, leased.stderr
    assert re.search(r"^machine [0-3]$", leased.stdout, re.M)

    answer = post(f"{stack.base}/v1/idgenerator/events/id")
    event_id = answer["response"]["id"]  # type: ignore[index]
    decoded = stack.run("decode", "--type", "events", str(event_id))
    assert decoded.returncode == 0, decoded.stderr
    assert json.loads(decoded.stdout)["id"] == str(event_id)

    client = subprocess.run(
        [str(BIN / "python"), "-c", CLIENT.format(base=stack.base)],
        cwd=stack.home,
        env=plain_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert client.returncode == 0, client.stderr
    assert len(set(client.stdout.split())) == 3


CLIENT = """
from keydispenser_client import KeyClient
with KeyClient("{base}", "shortlink") as keys:
    print(keys.take(), keys.take(), keys.take())
"""


def test_a_second_directory_with_data_dir_reaches_the_same_stack(
    stack: Stack, tmp_path: Path
) -> None:
    status = stack.run("--data-dir", str(stack.home / ".keydispenser"), "status", cwd=tmp_path)
    assert status.returncode == 0, status.stderr


def test_a_stack_that_stopped_is_named_not_guessed(stack: Stack, tmp_path: Path) -> None:
    stale = tmp_path / ".keydispenser"
    stale.mkdir()
    (stale / "stack.env").write_text((stack.home / ".keydispenser" / "stack.env").read_text())
    (stale / "up.pid").write_text("999999999\n")  # no such process
    status = stack.run("status", cwd=tmp_path)
    assert status.returncode == 2
    assert "not running" in status.stderr and "make up" in status.stderr


@pytest.mark.parametrize(
    ("command", "store"),
    [
        (("lease", "--pool", "p", "--min", "0", "--max", "1", "--", "true"), "KD_REDIS_URL"),
        (("fill", "--type", "farmer", "--count", "1"), "KD_POSTGRES_DSN"),
        (("migrate",), "KD_POSTGRES_DSN"),
        (("status",), "KD_POSTGRES_DSN"),
    ],
)
def test_a_command_with_no_server_named_refuses_instead_of_guessing(
    stack: Stack, tmp_path: Path, command: tuple[str, ...], store: str
) -> None:
    done = stack.run(*command, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    hint = "--data-dir" if command[0] == "lease" else "make up"  # lease wraps a service
    assert len(lines) == 1 and store in lines[0] and hint in lines[0], lines


def test_up_on_a_taken_port_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [str(BIN / "keydispenser"), "up", "--port", str(port)],
            cwd=tmp_path,
            env=plain_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert time.monotonic() - started < 30  # it does not start servers first
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "--port" in lines[0], lines
    assert not (tmp_path / ".keydispenser").exists()


# --- every code block of README.md and docs/ -------------------------------------


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    skip: str  # why it is not run ("" when it is)

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        start, lang, body = -1, "", list[str]()
        for i, line in enumerate(lines):
            fence = FENCE.match(line)
            if fence and start < 0:
                start, lang, body = i, fence.group(1), []
            elif line.startswith("```") and start >= 0:
                mark = SKIP.search(lines[start - 1]) if start > 0 else None
                found.append(Block(path, start + 1, lang, "\n".join(body), mark[1] if mark else ""))
                start = -1
            elif start >= 0:
                body.append(line)
    return found


def adapted(stack: Stack, code: str) -> str:
    """The block with the addresses the docs use replaced by the stack's."""
    return (
        code.replace("http://127.0.0.1:8080", stack.base)
        .replace("127.0.0.1:8080", f"127.0.0.1:{stack.port}")
        .replace("redis://127.0.0.1:6379/0", stack.settings["KD_REDIS_URL"])
        .replace(".venv/bin/", f"{BIN}/")
    )


def merged(base: dict[str, object], snippet: dict[str, object]) -> dict[str, object]:
    """``base`` with ``snippet`` laid over it, mappings merged key by key."""
    out = dict(base)
    for key, value in snippet.items():
        under = out.get(key)
        if isinstance(value, dict) and isinstance(under, dict):
            out[key] = merged(under, value)
        else:
            out[key] = value
    return out


def lease_library(tmp_path: Path) -> Path:
    """A folder holding ``keydispenser_leases`` as clients/leases builds it."""
    out = tmp_path / "leases"
    if not (out / "keydispenser_leases").is_dir():
        spec = importlib.util.spec_from_file_location(
            "leases_build", ROOT / "clients" / "leases" / "hatch_build.py"
        )
        assert spec is not None and spec.loader is not None
        build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build)
        build.write_package(ROOT / "shared", out)
    return out


def run_block(stack: Stack, block: Block, tmp_path: Path) -> str:
    """'' when the block works as written, else what went wrong."""
    if block.lang in ("json",):
        json.loads(block.code)
        return ""
    if block.lang == "yaml":
        body = yaml.safe_load(block.code)
        assert isinstance(body, dict), "a configuration block is a mapping"
        # A snippet goes into a configuration: the shipped default here.
        default = yaml.safe_load(default_config_path().read_text())
        config = tmp_path / "block.yaml"
        config.write_text(yaml.safe_dump(merged(default, body)))
        load_settings(config)  # every key a setting, every value valid
        return ""
    if block.lang in ("python", "sh"):
        argv = [str(BIN / "python"), "-c"] if block.lang == "python" else ["bash", "-e", "-c"]
        env = plain_env()
        if "keydispenser_leases" in block.code:  # the lease library, as its wheel holds it
            env["PYTHONPATH"] = str(lease_library(tmp_path))
        done = subprocess.run(
            [*argv, adapted(stack, block.code)],
            cwd=stack.home,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return "" if done.returncode == 0 else done.stdout[-1000:] + done.stderr[-2000:]
    return f"a {block.lang or 'plain'} block: run it, or say why not (docs-test: skip)"


def test_every_code_block_in_the_docs_runs_as_written(stack: Stack, tmp_path: Path) -> None:
    failures = []
    ran = 0
    for block in blocks():
        if block.skip or block.lang in ("", "text"):
            continue  # diagrams and layouts are not pasted; the rest says why not
        try:
            problem = run_block(stack, block, tmp_path)
        except (ValueError, AssertionError, yaml.YAMLError, ConfigError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        ran += 1
        if problem:
            failures.append(f"{block}: {problem}")
    assert not failures, "\n\n".join(failures)
    assert ran >= 15  # the blocks a user pastes: curl, the clients, leases, configurations


def test_purge_is_refused_while_the_stack_runs(stack: Stack) -> None:
    done = stack.run("up", "--purge")
    assert done.returncode == 2 and "running" in done.stderr, done.stderr
    assert (stack.home / ".keydispenser" / "stack.env").exists()


def test_purge_removes_a_stopped_stacks_data_wherever_postgres_kept_it(tmp_path: Path) -> None:
    """A stack killed with its PostgreSQL still running (PGDATA kept outside the data
    directory, as for root): purge stops it and removes both; a directory holding
    anything else is refused."""
    from keydispenser_ops.embedded import EmbeddedPostgres

    home = tmp_path / "home"
    home.mkdir()
    os.chmod(tmp_path, 0o700)  # the server's own user cannot enter: PGDATA goes outside
    data = home / ".keydispenser"
    env = plain_env()
    postgres = EmbeddedPostgres(data / "postgres")
    postgres.start()  # and never stopped: an `up` that was killed
    (data / "secrets").mkdir()
    (data / "secrets" / "permutation.key").write_text("k\n")
    (data / "up.pid").write_text("999999999\n")
    outside = postgres.pgdata
    (home / "notes").mkdir()
    stranger = subprocess.run(
        [str(BIN / "keydispenser"), "up", "--purge", "--data-dir", str(home)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert stranger.returncode == 2 and "notes" in stranger.stderr and home.exists()
    done = subprocess.run(
        [str(BIN / "keydispenser"), "up", "--purge"],
        cwd=home, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not data.exists() and not outside.exists()
    assert f"removed {data}" in done.stdout
    with pytest.raises(ConnectionRefusedError):  # its PostgreSQL was stopped first
        socket.create_connection(("127.0.0.1", postgres.port), timeout=2).close()


@pytest.mark.parametrize(
    "process", [("dispenser",), ("keygen",), ("keysync",), ("lease", "--", "true")]
)
def test_a_process_started_beside_a_dev_stack_never_reaches_its_servers(
    stack: Stack, process: tuple[str, ...]
) -> None:
    """In the stack's directory with nothing named, `status` and `lease list` use the
    stack (the control, above and below); a long-running process, or `lease` wrapping
    one, refuses, saying how to name a stack on purpose."""
    done = stack.run(*process)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--data-dir" in done.stderr and "named" in done.stderr
    assert "KD_REDIS_URL" in done.stderr or "KD_POSTGRES_DSN" in done.stderr


def test_lease_list_is_a_look_and_uses_the_stack_beside_it(stack: Stack) -> None:
    done = stack.run("lease", "list", "--pool", "demo")
    assert done.returncode == 0, done.stderr


def test_up_refuses_a_stack_named_before_it(stack: Stack, tmp_path: Path) -> None:
    """`keydispenser --data-dir X up --purge` would otherwise purge ./.keydispenser."""
    done = stack.run("--data-dir", str(tmp_path), "up", "--purge")
    assert done.returncode == 2 and "up --data-dir DIR" in done.stderr, done.stderr
    assert (stack.home / ".keydispenser" / "stack.env").exists()

"""The command line's plugins: the tooling's commands are entry points of
``keydispenser.commands``, and a plugin that cannot be loaded takes down its own
command only, saying why."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from keydispenser_ops import cli as tooling
from shared import logs
from shared.cli import main as cli
from shared.cli import plugins, stack
from shared.cli.plugins import GROUP, MORE_COMMANDS, Command, Unavailable, discover, load
from shared.domain.config import Settings

ROOT = Path(__file__).resolve().parents[2]
# The least each tooling command parses.
ARGV = {
    "up": ["up"],
    "fill": ["fill", "--type", "farmer", "--count", "1"],
    "bench": ["bench", "keygen"],
    "drill": ["drill"],
    "simulate": ["simulate", "--seeds", "1"],
}


def declared_in_pyproject() -> dict[str, str]:
    """The tooling distribution's entry points (ops/pyproject.toml)."""
    with (ROOT / "ops" / "pyproject.toml").open("rb") as file:
        table: dict[str, str] = tomllib.load(file)["project"]["entry-points"][GROUP]
    return table


@dataclass(frozen=True)
class FakePoint:
    """An entry point whose load gives ``plugin`` or raises ``error``."""

    name: str
    value: str
    plugin: object = None
    error: Exception | None = None

    @property
    def module(self) -> str:
        return self.value.partition(":")[0]

    def load(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.plugin


def offer(monkeypatch: pytest.MonkeyPatch, *points: FakePoint) -> None:
    """The command line sees these entry points instead of the installed ones."""
    monkeypatch.setattr(plugins, "declared", lambda: points)


def listing_of(parser: argparse.ArgumentParser) -> str:
    """``--help``, its lines joined (argparse wraps them to the terminal's width)."""
    return " ".join(parser.format_help().split())


def recorder(calls: list[argparse.Namespace]) -> Callable[[Settings, argparse.Namespace], None]:
    def run(settings: Settings, args: argparse.Namespace) -> None:
        calls.append(args)

    return run


def test_every_command_of_the_tooling_is_declared_as_an_entry_point() -> None:
    commands = sorted(name for name, value in vars(tooling).items() if isinstance(value, Command))
    declared = declared_in_pyproject()
    assert sorted(declared.values()) == [f"keydispenser_ops.cli:{name}" for name in commands]
    assert set(declared) == set(ARGV)


def test_the_installed_entry_points_are_the_declared_ones() -> None:
    """The environment's metadata agrees with pyproject.toml (make re-installs on a change)."""
    assert {point.name: point.value for point in entry_points(group=GROUP)} == (
        declared_in_pyproject()
    )


def test_each_tooling_command_is_found_and_offered_with_its_handler() -> None:
    found = discover()
    parser = cli.parser()
    listing = listing_of(parser)
    for name, value in declared_in_pyproject().items():
        command = getattr(tooling, value.rpartition(":")[2])
        assert found[name] is command
        assert name in listing and command.help in listing
        args = parser.parse_args(ARGV[name])
        assert (args.command, args.plugin, args.func) == (name, command, command.run)


def test_global_options_still_come_before_a_plugins_command() -> None:
    args = cli.parser().parse_args(["--config", "my.yaml", "up", "--data-dir", "d", "--port", "1"])
    assert (args.config, args.stack_dir, args.command) == ("my.yaml", None, "up")
    assert (args.data_dir, args.port) == ("d", 1)


def test_a_plugin_whose_module_or_dependency_is_missing_is_reported_as_broken() -> None:
    """A declared plugin that cannot be imported is a broken installation, named as
    such: its own module missing, or a dependency it lacks."""
    for missing in ("keydispenser_ops", "keydispenser_ops.cli", "yaml2"):
        error = ModuleNotFoundError(f"No module named '{missing}'", name=missing)
        found = load(FakePoint("up", "keydispenser_ops.cli:UP", error=error))
        assert isinstance(found, Unavailable)
        assert "keydispenser_ops.cli:UP" in found.reason and missing in found.reason


def test_a_plugin_that_fails_to_load_or_is_no_command_is_unavailable() -> None:
    broken = load(FakePoint("x", "tools:X", error=RuntimeError("boom")))
    assert isinstance(broken, Unavailable) and "RuntimeError: boom" in broken.reason
    wrong = load(FakePoint("x", "tools:X", plugin=object()))
    assert isinstance(wrong, Unavailable) and "tools:X is not a Command" in wrong.reason


def test_a_command_is_loaded_as_it_is_and_the_first_declaration_wins() -> None:
    first, second = Command("first", recorder([])), Command("second", recorder([]))
    found = discover([FakePoint("x", "a:X", first), FakePoint("x", "b:X", second)])
    assert found == {"x": first}


def test_a_command_this_installation_lacks_says_where_more_come_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    offer(monkeypatch)  # the runtime installed alone: no plugin declared
    assert MORE_COMMANDS in listing_of(cli.parser())
    with pytest.raises(SystemExit) as stop:
        cli.main(["--config", "nowhere.yaml", "up", "--port", "1"])
    assert stop.value.code == 2
    said = capsys.readouterr().err
    assert "invalid choice: 'up'" in said and MORE_COMMANDS in said


def test_a_broken_plugin_leaves_the_other_commands_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    offer(monkeypatch, FakePoint("broken", "tools:X", error=RuntimeError("boom")))
    assert cli.parser().parse_args(["status"]).func is cli.run_status
    with pytest.raises(SystemExit) as stop:
        cli.main(["broken"])
    assert stop.value.code == 1
    assert "keydispenser broken: its plugin tools:X cannot be loaded" in capsys.readouterr().err


def test_a_plugin_cannot_take_a_runtime_commands_name(monkeypatch: pytest.MonkeyPatch) -> None:
    offer(monkeypatch, FakePoint("migrate", "tools:X", Command("not it", recorder([]))))
    assert cli.parser().parse_args(["migrate"]).func is cli.run_migrate


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """main() as a plugin's command meets it: no stack beside it, no settings given,
    and the test's own log handlers left in place."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(logs, "configure", lambda *args, **kwargs: None)
    stores = [name for names in stack.STORE_VARIABLES.values() for name in names]
    for name in ("KD_CONFIG", "CREDENTIALS_DIRECTORY", *stores):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("quiet")
def test_a_plugin_that_needs_the_configuration_is_refused_the_built_in_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[argparse.Namespace] = []
    needs = Command("p", recorder(calls), needs_config=True)
    offer(monkeypatch, FakePoint("probe", "tools:P", needs))
    with pytest.raises(SystemExit) as stop:
        cli.main(["probe"])
    assert stop.value.code == 2 and "KD_CONFIG=builtin" in capsys.readouterr().err
    monkeypatch.setenv("KD_CONFIG", "builtin")
    cli.main(["probe"])
    assert [args.command for args in calls] == ["probe"]


@pytest.mark.usefixtures("quiet")
def test_a_plugin_that_runs_its_own_servers_refuses_a_stack_named_before_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[argparse.Namespace] = []
    own = Command("p", recorder(calls), own_servers="it runs its own")
    offer(monkeypatch, FakePoint("probe", "tools:P", own))
    with pytest.raises(SystemExit) as stop:
        cli.main(["--data-dir", "elsewhere", "probe"])
    assert stop.value.code == 2 and "it runs its own" in capsys.readouterr().err
    cli.main(["probe"])
    assert len(calls) == 1


@pytest.mark.usefixtures("quiet")
def test_a_plugin_is_refused_a_store_nobody_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[argparse.Namespace] = []
    needs = Command("p", recorder(calls), stores=frozenset({"postgres"}))
    offer(monkeypatch, FakePoint("probe", "tools:P", needs))
    with pytest.raises(SystemExit) as stop:
        cli.main(["probe"])
    assert stop.value.code == 2 and "postgres" in capsys.readouterr().err
    assert calls == []


def test_a_runtime_command_loads_no_plugin() -> None:
    """``keydispenser dispenser`` (and every command of the runtime's own) runs no other
    package's code: no plugin is loaded, the tooling is never imported."""
    code = (
        "import sys\n"
        "from shared.cli import main\n"
        "main.parser(['--config', 'up.yaml', 'dispenser'])\n"
        "assert not [m for m in sys.modules if m.startswith('keydispenser_ops')], 'loaded'\n"
        "main.parser(['up', '--port', '1'])\n"
        "assert 'keydispenser_ops.cli' in sys.modules, 'the chosen plugin was not loaded'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)

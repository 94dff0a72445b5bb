"""Commands other distributions add to ``keydispenser``, found as pytest and Flask find
their plugins: each entry point of the group ``keydispenser.commands`` names a
``Command``, and its name is the command's. The runtime's command line names none of
them; the operator tooling (the ``keydispenser-ops`` distribution, ``ops/``) declares
``up``, ``fill``, ``bench``, ``drill`` and ``simulate`` so in its pyproject.toml.

A command whose plugin cannot be loaded (a broken installation) is still listed, and says
why when run, instead of taking the command line down with it.

A plugin takes from the command line only what this module offers: ``Command`` and,
for a plugin that runs servers of its own (``up``), ``stack``: the file that says where
they are, which every other command reads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, NoReturn, Protocol

from shared.cli import stack as stack  # offered: where a plugin's servers are (below)
from shared.domain.config import Settings

GROUP = "keydispenser.commands"
Handler = Callable[[Settings, argparse.Namespace], None]


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command that takes no options of its own."""


@dataclass(frozen=True)
class Command:
    """What a plugin offers: its help line, how it adds its arguments to its parser, its
    handler, and what the command line checks before the handler runs."""

    help: str
    run: Handler
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_arguments
    # The stores it reaches, which must have been named (stack.require_named).
    stores: frozenset[str] = frozenset()
    # It acts on the configuration's types: refused on the built-in one unless asked for.
    needs_config: bool = False
    # Non-empty: it runs its own servers, and this is the refusal of --data-dir/--env-file
    # given before it (empty: it uses the stack they name, as the runtime's commands do).
    own_servers: str = ""


@dataclass(frozen=True)
class Unavailable:
    """A declared command whose plugin cannot be loaded here: listed, and its answer."""

    help: str
    reason: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """None (it answers whatever options follow it); its --help says why."""
        parser.description = f"{self.reason}."

    def run(self, settings: Settings | None, args: argparse.Namespace) -> NoReturn:
        """Its answer, before any setting is read (exit 1)."""
        print(f"keydispenser {args.command}: {self.reason} (exit 1)", file=sys.stderr)
        sys.exit(1)


# Said of a command this installation does not have: where more commands come from.
MORE_COMMANDS = (
    "the operator tooling's commands come with the keydispenser-ops distribution "
    "(ops/ in a checkout: `make up` installs it, or pip install -e ops)"
)


class Declared(Protocol):
    """An entry point, as importlib.metadata gives it."""

    @property
    def name(self) -> str: ...

    @property
    def value(self) -> str: ...

    @property
    def module(self) -> str: ...

    def load(self) -> Any: ...


def declared() -> Iterable[Declared]:
    """The entry points of the group, from every installed distribution."""
    return entry_points(group=GROUP)


def discover(points: Iterable[Declared] | None = None) -> dict[str, Command | Unavailable]:
    """Each declared command by its name (the first declaration of a name wins)."""
    found: dict[str, Command | Unavailable] = {}
    every = declared() if points is None else points
    for point in sorted(every, key=lambda point: point.name):  # listed in this order
        if point.name not in found:
            found[point.name] = load(point)
    return found


def load(point: Declared) -> Command | Unavailable:
    """The plugin an entry point names; what stands in for it when it cannot be loaded."""
    try:
        plugin = point.load()
    except Exception as exc:  # a broken plugin takes down its own command only
        return _broken(point, exc)
    if not isinstance(plugin, Command):
        return Unavailable("cannot be loaded here", f"{point.value} is not a Command")
    return plugin


def _broken(point: Declared, exc: Exception) -> Unavailable:
    reason = f"its plugin {point.value} cannot be loaded: {type(exc).__name__}: {exc}"
    return Unavailable("cannot be loaded here", reason)

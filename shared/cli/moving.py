"""The options of ``keydispenser import`` and ``export``; their handlers import what they
run (``imports.py``, ``exports.py``) only when called, so that no other command loads it."""

from __future__ import annotations

import argparse

from shared.domain.config import Settings
from shared.domain.imports import FILE


def run_import(settings: Settings, args: argparse.Namespace) -> None:
    from shared.cli.imports import run

    run(settings, args)


def run_export(settings: Settings, args: argparse.Namespace) -> None:
    from shared.cli.exports import run

    run(settings, args)


def add_import(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``import openg2p|mosip|file``."""
    command = commands.add_parser(
        "import", help="exclude for good what another generator issued (OpenG2P, MOSIP, a file)"
    )
    command.set_defaults(func=run_import)
    sources = command.add_subparsers(dest="source", required=True, metavar="SOURCE")
    openg2p = sources.add_parser("openg2p", help="OpenG2P ID Generator's id_pool_<type> table")
    openg2p.add_argument("--from", dest="dsn", required=True, help="its database (read only)")
    openg2p.add_argument("--type", required=True, dest="type_name", help="the ID type here")
    openg2p.add_argument("--table", help="its table (default: id_pool_<type>)")
    mosip = sources.add_parser("mosip", help="MOSIP kernel's kernel.uin and kernel.vid tables")
    mosip.add_argument("--from", dest="dsn", required=True, help="its database (read only)")
    mosip.add_argument("--uin-type", help="the ID type here MOSIP's UINs go to")
    mosip.add_argument("--vid-type", help="the ID type here MOSIP's VIDs go to")
    file = sources.add_parser("file", help="one ID a line, optionally a status after it")
    file.add_argument("path", help="the file, or - for standard input")
    file.add_argument("--type", required=True, dest="type_name", help="the ID type here")
    file.add_argument(
        "--status",
        default="ISSUED",
        type=str.upper,
        help=f"the status of lines without one (default ISSUED; one of {', '.join(FILE)})",
    )
    for each in (openg2p, mosip, file):
        each.add_argument(
            "--client",
            help="the API client the issued IDs belong to in the ledger, the one whose "
            "lookups and status changes answer for them (default: the source's name)",
        )
        each.add_argument(
            "--dry-run", action="store_true", help="say what it would do; change nothing"
        )


def add_export(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``export --type T [--format csv|jsonl]``."""
    command = commands.add_parser(
        "export", help="write a ledger type's ledger (key, status, client, times), streamed"
    )
    command.set_defaults(func=run_export)
    command.add_argument("--type", required=True, dest="type_name", help="the ID type")
    command.add_argument("--format", choices=("csv", "jsonl"), default="csv")

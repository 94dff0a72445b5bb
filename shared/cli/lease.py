"""``keydispenser lease``: run a command holding a machine ID, and list who holds what.

The command runs with ``KD_MACHINE_ID`` (and ``KD_MACHINE_ID_POOL``,
``KD_MACHINE_ID_FLOOR_MS``) set while this process renews the lease. The moment the
lease is lost the command gets SIGTERM, and SIGKILL ``kill_after_s`` later: a command
that keeps running after its lease is gone is the duplicate this prevents. SIGTERM and
SIGINT sent to this process are forwarded; if this process dies, the kernel sends the
command SIGTERM (Linux). The exit status is the command's (128 + N when signal N ended
it); 75 (EX_TEMPFAIL) when no machine ID was free within ``--wait``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import dataclasses
import datetime
import functools
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from shared.domain.config import Settings
from shared.domain.errors import NoMachineIdFree
from shared.domain.leases import lease_wait, safety_margin_s
from shared.leases.holder import LeaseMetrics, MachineLease, default_owner, lease_machine_id
from shared.leases.store import Holders, MachineLeases
from shared.metrics import serve
from shared.stores.redis.endpoint import RedisEndpoint

EX_TEMPFAIL = 75  # sysexits.h: try again later
EX_NOTFOUND = 127
EX_NOEXEC = 126
FORWARDED = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class LeaseRun:
    pool: str
    lo: int
    hi: int
    command: Sequence[str]
    wait_s: float = 0.0
    ttl_s: float = 10.0
    renew_every_s: float = 1.0
    kill_after_s: float | None = None  # default: the lease's safety margin
    metrics_port: int | None = None  # serve /metrics here while the command runs
    metrics_host: str = "127.0.0.1"


def main(settings: Settings, args: argparse.Namespace) -> int:
    """``keydispenser lease ... -- COMMAND`` or ``keydispenser lease list``: the exit
    status (argparse's ``lease_parser`` reports usage errors)."""
    command = list(args.lease_command)
    if command and command[0] == "list":
        listing = _list_parser().parse_args(command[1:], argparse.Namespace(pool=args.pool))
        if listing.pool is None:
            args.lease_parser.error("lease list: --pool is required")
        found = asyncio.run(holders(settings, listing.pool))
        print(json.dumps(found, indent=2) if listing.json else format_holders(found))
        return 0
    if command and command[0] == "--":
        command = command[1:]
    missing = [f"--{n}" for n in ("pool", "min", "max") if getattr(args, n) is None]
    if missing or not command:
        args.lease_parser.error(f"needs {' '.join(missing) or 'a COMMAND'} (see --help)")
    spec = LeaseRun(args.pool, args.min, args.max, command, args.wait, args.ttl)
    spec = dataclasses.replace(
        spec,
        renew_every_s=args.renew_every,
        kill_after_s=args.kill_after,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    return run(settings, spec)


def _list_parser() -> argparse.ArgumentParser:
    listing = argparse.ArgumentParser(prog="keydispenser lease list")
    listing.add_argument("--pool", help="pool name")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    return listing


def run(settings: Settings, spec: LeaseRun) -> int:
    """Run ``spec.command`` holding a lease; returns the exit status to use."""
    try:
        return asyncio.run(_run(settings, spec))
    except NoMachineIdFree as exc:
        print(f"keydispenser lease: {exc} (exit {EX_TEMPFAIL})", file=sys.stderr)
        return EX_TEMPFAIL


async def _run(settings: Settings, spec: LeaseRun) -> int:
    namespace = settings.key_namespace_of(spec.pool)  # the pool's key group
    endpoint = RedisEndpoint.for_keys(settings, namespace)
    owner = f"{default_owner()}:{Path(spec.command[0]).name}"
    registry = CollectorRegistry()
    server = serve(registry, spec.metrics_host, spec.metrics_port)
    try:
        async with lease_machine_id(
            endpoint,
            spec.pool,
            spec.lo,
            spec.hi,
            ttl_s=spec.ttl_s,
            renew_every_s=spec.renew_every_s,
            wait_s=spec.wait_s,
            owner=owner,
            metrics=LeaseMetrics(registry),
            namespace=namespace,
            wait=lease_wait(settings),
        ) as lease:
            kill_after = spec.kill_after_s
            if kill_after is None:
                kill_after = safety_margin_s(spec.ttl_s)
            return await supervise(lease, spec.command, kill_after)
    finally:
        await endpoint.close()
        if server is not None:
            server.shutdown()


def child_env(lease: MachineLease) -> dict[str, str]:
    return os.environ | {
        "KD_MACHINE_ID": str(lease.machine_id),
        "KD_MACHINE_ID_POOL": lease.pool,
        "KD_MACHINE_ID_FLOOR_MS": str(lease.floor_ms),
    }


async def supervise(lease: MachineLease, command: Sequence[str], kill_after_s: float) -> int:
    """Run ``command`` until it exits; SIGTERM it the moment ``lease`` is lost."""
    try:
        child = await asyncio.create_subprocess_exec(
            *command,
            env=child_env(lease),
            preexec_fn=functools.partial(_terminate_with_parent, os.getpid()),
        )
    except OSError as exc:
        print(f"keydispenser lease: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return EX_NOTFOUND if isinstance(exc, FileNotFoundError) else EX_NOEXEC
    loop = asyncio.get_running_loop()
    for sig in FORWARDED:
        loop.add_signal_handler(sig, _forward, child, sig)
    try:
        exited = asyncio.ensure_future(child.wait())
        lost = asyncio.ensure_future(lease.lost.wait())
        await asyncio.wait({exited, lost}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        if not exited.done():
            await _stop(child, exited, lease, kill_after_s)
        return exit_status(await exited)
    finally:
        for sig in FORWARDED:
            loop.remove_signal_handler(sig)


async def _stop(
    child: asyncio.subprocess.Process,
    exited: asyncio.Future[int],
    lease: MachineLease,
    grace: float,
) -> None:
    print(
        f"keydispenser lease: lost machine ID {lease.machine_id} of pool '{lease.pool}' "
        f"({lease.lost_reason}); sending the command SIGTERM",
        file=sys.stderr,
    )
    _forward(child, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(exited), grace)
    except TimeoutError:
        print(f"keydispenser lease: still running after {grace:g}s: SIGKILL", file=sys.stderr)
        _forward(child, signal.SIGKILL)


def _forward(child: asyncio.subprocess.Process, sig: int) -> None:
    if child.returncode is None:
        child.send_signal(sig)


def exit_status(returncode: int) -> int:
    """A shell's convention: 128 + N when signal N ended the command."""
    return 128 - returncode if returncode < 0 else returncode


def _terminate_with_parent(parent: int) -> None:
    """In the child, before exec: SIGTERM when this process dies (Linux only); exit at
    once if it died before that was set (the child was re-parented already)."""
    name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and name:
        ctypes.CDLL(name, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(EX_TEMPFAIL)


async def holders(settings: Settings, pool: str) -> dict[str, Any]:
    """Who holds which ID of ``pool``, as ``keydispenser lease list`` prints it."""
    namespace = settings.key_namespace_of(pool)
    store = MachineLeases(RedisEndpoint.for_keys(settings, namespace), namespace)
    try:
        found = await store.holders(pool)
    finally:
        await store.close()
    return report(pool, found)


def report(pool: str, found: Holders) -> dict[str, Any]:
    return {
        "pool": pool,
        "settling_s": found.settling_ms / 1000,
        "holders": [
            {
                "id": h.machine_id,
                "owner": h.owner,
                "since": _iso(h.since_ms),
                "expires_in_s": h.expires_in_ms / 1000,
                "last_ms": h.last_ms,
            }
            for h in found.holders
        ],
    }


def format_holders(report: dict[str, Any]) -> str:
    lines = [f"pool {report['pool']}: {len(report['holders'])} held"]
    if report["settling_s"] > 0:
        lines[0] += f"; grants resume in {report['settling_s']:.1f}s (the fence took over)"
    lines.append(f"{'id':>6}  {'owner':<40} {'since':<29} {'expires_in':>10}  last_ms")
    for h in report["holders"]:
        lines.append(
            f"{h['id']:>6}  {h['owner']:<40} {h['since']:<29} "
            f"{h['expires_in_s']:>9.1f}s  {h['last_ms']}"
        )
    return "\n".join(lines)


def _iso(ms: int) -> str:
    at = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return at.isoformat(timespec="milliseconds")

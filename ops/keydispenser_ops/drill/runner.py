"""``keydispenser drill``: failovers, partitions, pauses, restarts and SIGKILLs under load.

Every key received is recorded; the checker (history.py) looks at the whole history:
no key received twice, no snowflake ID twice, no two lease intervals overlapping, every
ledger record of what clients were given and marked, no process exit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis

from keydispenser_ops.drill import fault_kinds, history, leases, lifecycle
from keydispenser_ops.drill.faults import DRILL_NAMESPACE, Drill, Fault, Outcome
from keydispenser_ops.drill.fleet import Fleet
from keydispenser_ops.drill.leases import LeaseFaults
from keydispenser_ops.drill.lifecycle import LIFECYCLE_CLIENTS, LifecycleLoad
from keydispenser_ops.drill.links import PROCESSES, Links
from keydispenser_ops.drill.load import RecordingLoad, SnowflakeLoad
from keydispenser_ops.drill.pair_faults import PairFaults
from keydispenser_ops.drill.patroni import PatroniStack
from keydispenser_ops.drill.patroni_faults import PatroniFaults
from keydispenser_ops.drill.postgres import PostgresPair, PostgresStack
from keydispenser_ops.drill.report import Report, common_fields
from keydispenser_ops.drill.rounds import Round, measure_disruptions
from keydispenser_ops.drill.topology import MASTER, Topology
from keydispenser_ops.embedded import free_port
from keydispenser_ops.processes import run_cli, scrubbed_env, serving
from shared.domain.config import Settings
from shared.stores.postgres.databases import scratch_database

log = logging.getLogger(__name__)
SETTLE_S = 2.0  # normal load between faults
# The one ID type the drill takes keys of; it keeps a ledger, checked after the drill.
DRILL_TYPE = "drill"
DRILL_CLIENT = "drill-load"  # the API client of the plain loads (keys, snowflake IDs)
DRILL_TYPE_CONFIG: dict[str, Any] = {
    "kind": "numeric",
    "length": 10,
    "range_size": 262_144,
    "hot": {"low": 3_000, "high": 8_000},
    "cold": {"low": 30_000, "high": 60_000},
    "sync_batch": 1_000,
    "ledger": True,
}
# Every deadline and TTL the drill's processes have is short, so that a pause
# (faults.PAUSE_S) outlasts them all.
DRILL_KEYSYNC = {
    "poll_interval_s": 0.2,
    "ledger_claim_idle_s": 2.0,
    "push_retry_s": 2.0,
    "batch_marker_ttl_s": 2.0,
    "take_idle_limit_s": 3.0,
    "ledger_requeue_every_s": 1.0,  # the lifecycle's released UINs go back within seconds
    # The ledger log (keysync.ledger_retain_s) is the PostgreSQL stack's own
    # (PostgresStack.ledger_retain_s): it outlives every loss window a fault makes.
}
# Faults that give Redis a primary with a new identity: the fence must engage after each.
REDIS_FAULTS = fault_kinds.new_primary("sentinel")
FENCE_DEADLINE_S = 15.0  # how long after a fault the fence (Redis's, PostgreSQL's) may take
LEDGER_DRAIN_S = 60.0  # how long the drill waits, at its end, for keysync to drain the ledger


@dataclass(frozen=True)
class Controls:
    """The drill's switches that show a hazard: False runs without the mechanism."""

    postgres_fence: bool = True
    lease_wait: bool = True


@dataclass(frozen=True)
class DrillReport(Report):
    """The Sentinel drill: what every drill reports (``Report``), and the PostgreSQL
    fence's and the machine-ID leases' own figures and checks."""

    kind: ClassVar[str] = "failover"

    by_fault: dict[str, dict[str, Any]]
    ledger_missing: int
    ledger_used_missing: int
    ledger_duplicate_alarms: int
    # What a fault destroyed by definition (the default durability's records in Redis
    # data lost), per fault: each record charged by its time (history.LossSpan).
    ledger_lost_to_fault: dict[str, int]
    keys_in_two_hands: int
    status_changes_lost: int
    ledger_wrong_client: int
    fail_closed_s: float
    fail_closed_by_process: dict[str, float]
    lease_renewals_unreplicated: int
    # Ledger restores keysync made after PostgreSQL fences (what a promotion lost,
    # written again from the ledger log), and ledger halts (must stay 0 here).
    ledger_restores: int
    ledger_halts: int
    lease_faults_not_observed: list[int]
    leases: leases.LeaseReport
    postgres_fence: bool  # the controls: False shows the hazard the fence closes
    lease_wait: bool
    # The ledger links those restores wrote again (0: nothing any promotion lost).
    ledger_links_restored: int = 0
    # What ran: Redis's topology, PostgreSQL's stack (pair, or Patroni and whether in
    # synchronous mode), with versions (PostgresStack.describe).
    stack: dict[str, Any] = field(default_factory=dict)

    def own_checks(self) -> list[tuple[bool, str]]:
        held = self.leases
        return [
            (held.snowflake_duplicates == 0, "snowflake IDs issued twice"),
            (held.lease_overlaps == 0, f"{held.lease_overlaps} leases overlapped"),
            (self.ledger_halts == 0, f"the ledger halted {self.ledger_halts} times"),
            (
                not self.lease_faults_not_observed,
                f"lease faults not observed in rounds {self.lease_faults_not_observed}",
            ),
            (
                held.lease_holder_unexpected_exits == 0,
                f"lease holders exited unexpectedly: {held.lease_holder_exits}",
            ),
            *self._synchronous_checks(),
        ]

    def _synchronous_checks(self) -> list[tuple[bool, str]]:
        """With a synchronous standby promoted (Patroni's synchronous_mode), no ledger
        commit is lost: no fence discards, nothing for the ledger's restore to do."""
        if not self.stack.get("synchronous_mode"):
            return []
        discarded = sum(row.get("postgres_keys_discarded") or 0 for row in self.faults)
        return [
            (discarded == 0, f"synchronous mode: PostgreSQL fences discarded {discarded} keys"),
            (
                self.ledger_links_restored == 0,
                f"synchronous mode: the ledger restored {self.ledger_links_restored} links",
            ),
        ]

    def fields(self) -> dict[str, Any]:
        fields = asdict(self)
        lease_fields = fields.pop("leases")  # inline
        fields.pop("ledger_duplicate_alarms")  # it is ledger["duplicate_alarms"]
        return {**fields, **lease_fields}


@dataclass
class Runner:
    drill: Drill
    rounds: list[Round] = field(default_factory=list)

    async def round(self, number: int, name: str) -> None:
        drill = self.drill
        await asyncio.sleep(SETTLE_S)
        before, requests = drill.discarded(), drill.load.requests
        identity = await asyncio.to_thread(drill.topology.identity)
        undrained_since = await asyncio.to_thread(drill.oldest_undrained)
        began, wall = time.monotonic(), time.time()
        error, outcome = None, Outcome()
        try:
            outcome = await drill.faults()[name]()
        except (RuntimeError, redis.RedisError, OSError) as exc:
            # The fault could not be injected as planned: say so, restore, go on.
            error = str(exc)
            log.error("drill_fault_failed", extra={"fault": name, "error": error})
            drill.links.heal()
            await drill.settle_redis()
        ended = time.monotonic()
        figures = dict(outcome.figures)
        engaged = None
        if name in REDIS_FAULTS:
            identity_figures, engaged = await self._identity_figures(identity)
            figures |= identity_figures
            # Leases were held through it: every worker must hold a new one.
            figures |= await drill.lease_faults.reacquired(wall * 1000)
        fenced_before = outcome.postgres_discarded_before
        if fenced_before is not None:
            # From the fault's end (its heal) to a PostgreSQL fence seen (None: none).
            seen = await drill.postgres_fenced_since(fenced_before, FENCE_DEADLINE_S) > 0
            seen_ms = round((time.monotonic() - ended) * 1000)
            figures["postgres_fence_ms"] = seen_ms if seen else None
        await asyncio.sleep(1.0)  # let the first refill after the fault land
        if outcome.redis_discarded_before is not None:
            before = outcome.redis_discarded_before
        discarded = max(drill.discarded() - before, 0)
        if fenced_before is not None:
            fenced = max(await drill.postgres_discarded() - fenced_before, 0)
            figures["postgres_keys_discarded"] = fenced
            discarded += fenced
        drill.lease_faults.respawn_cli_holders()
        done = Round(number, name, began, ended, wall, error, discarded)
        done.figures = {"requests": drill.load.requests - requests, **figures}
        done.fence_engaged = engaged
        starts = [began, undrained_since, outcome.destroys_from]
        done.loss_from = min(t for t in starts if t is not None)
        done.process_exits = drill.fleet.restart_exited()
        self.rounds.append(done)
        log.info("drill_round", extra=done.row())

    async def _identity_figures(
        self, before: tuple[int, str] | None
    ) -> tuple[dict[str, Any], bool]:
        """After a Redis fault: did the primary change identity, and did the fence engage."""
        after = await asyncio.to_thread(self.drill.topology.identity)
        changed = before is not None and after is not None and after[1] != before[1]
        engaged = (
            changed
            and after is not None
            and await self.drill.fence_engaged(after[1], FENCE_DEADLINE_S)
        )
        figures = {
            "primary_port_before": before[0] if before else None,
            "primary_port_after": after[0] if after else None,
            "identity_changed": changed,
        }
        return figures, engaged

    def measure_disruptions(self) -> None:
        """Outage figures per round, from every request the load made (after the drill)."""
        measure_disruptions(self.rounds, self.drill.load)


async def run(
    settings: Settings,
    rounds: int,
    only: list[str] | None,
    work_dir: Path | None,
    postgres_fence: bool = True,
    lease_wait: bool = True,
    stack: Stack | None = None,
) -> DrillReport:
    with tempfile.TemporaryDirectory(prefix="kd-drill-") as tmp:
        base = work_dir or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o755)  # embedded PostgreSQL runs unprivileged when we are root
        controls = Controls(postgres_fence, lease_wait)
        return await _drill(settings, rounds, only, base, controls, stack or Stack())


Faults = Callable[[], dict[str, Fault]]


@dataclass(frozen=True)
class Stack:
    """The PostgreSQL stack the drill runs (``--postgres``; ``--synchronous-mode``)."""

    postgres: fault_kinds.PostgresStack = "pair"
    synchronous_mode: bool = False

    def build(self, base: Path, links: Links) -> tuple[PostgresStack, Callable[[Drill], Faults]]:
        """The stack, and how its faults are made for a drill (registered by name)."""
        if self.postgres == "patroni":
            cluster = PatroniStack(base / "patroni", links, self.synchronous_mode)
            return cluster, lambda drill: PatroniFaults(drill, cluster).faults
        pair = PostgresPair(base)
        return pair, lambda drill: PairFaults(drill, pair).faults


async def _drill(
    settings: Settings,
    rounds: int,
    only: list[str] | None,
    base: Path,
    controls: Controls,
    stack: Stack,
) -> DrillReport:
    """The drill runs its own servers (it kills, pauses, cuts and promotes them): Redis
    with replicas and Sentinels, PostgreSQL (a streaming pair, or Patroni's cluster),
    every link of every process through a proxy of its own (links.py)."""
    links = Links()
    topology = Topology(base / "redis", announce=links.announce)
    postgres, postgres_faults = stack.build(base, links)
    fleet: Fleet | None = None
    load: RecordingLoad | None = None
    snowflakes: SnowflakeLoad | None = None
    try:
        topology.start()
        await asyncio.to_thread(postgres.start)
        database = f"kd_drill_{os.getpid()}"
        await scratch_database(postgres.admin_dsn("postgres"), database)
        redis_ports = [s.port for s in topology.servers]
        links.wire(redis_ports, [s.port for s in topology.sentinels], postgres.ports())
        api_config, api_keys = lifecycle.api_keys((DRILL_CLIENT, *LIFECYCLE_CLIENTS))
        fleet = _fleet(settings, base, postgres, database, topology, controls, api_config)
        fleet.overrides = {name: links.env(name, MASTER, database) for name in PROCESSES}
        migrated = await asyncio.to_thread(_migrate, fleet)
        if migrated:
            raise RuntimeError(f"migrate failed: {migrated}")
        ports = [free_port(), free_port()]
        fleet.spawn("keygen", "keygen")
        # Two keysyncs: the ledger stream's consumer group shares its entries between
        # them, so two changes of one UIN can be decided by either, in either order.
        fleet.spawn("keysync", "keysync")
        fleet.spawn("keysync-2", "keysync")
        for i, port in enumerate(ports):
            extra = {"KD_DISPENSER__PORT": str(port)} | leases.dispenser_env()
            fleet.spawn(f"dispenser-{i}", "dispenser", extra)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            if not await asyncio.to_thread(serving, f"{url}/readyz", 60):
                raise RuntimeError(f"{url}/readyz not ready after 60s")
        headers = {"X-API-Key": api_keys[DRILL_CLIENT]}
        load = RecordingLoad(urls, DRILL_TYPE, headers=headers)
        snowflakes = SnowflakeLoad(
            urls, leases.SNOWFLAKE_TYPE, leases.SNOWFLAKE_TYPE_CONFIG, headers=headers
        )
        uins = LifecycleLoad(urls, {n: api_keys[n] for n in LIFECYCLE_CLIENTS})
        lease_faults = LeaseFaults(fleet, snowflakes)
        lease_faults.start_cli_holders()
        drill = Drill(
            topology,
            fleet,
            load,
            postgres,
            links,
            database,
            base / "snapshot.rdb",
            lease_faults,
            ledger_loads=[load, uins],
        )
        drill.postgres_faults = postgres_faults(drill)
        kinds = fault_kinds.chosen("sentinel", only, stack.postgres)
        fault_kinds.check_implemented("sentinel", drill.faults(), stack.postgres)
        until = time.monotonic() + rounds * 45 + 60
        holders_done = asyncio.Event()  # the CLI lease holders' supervisor stops
        running = asyncio.ensure_future(
            asyncio.gather(
                load.run(until),
                snowflakes.run(until),
                uins.run(until),
                lease_faults.supervise(holders_done, until),
            )
        )
        runner = Runner(drill)
        for number in range(rounds):
            await runner.round(number + 1, kinds[number % len(kinds)])
        await asyncio.sleep(SETTLE_S)
        load.stop()
        snowflakes.stop()
        await uins.until_reissued(lifecycle.REISSUE_WAIT_S)
        uins.stop()
        holders_done.set()
        await running
        runner.measure_disruptions()
        # keysync applies what the stream still holds before it stops (after a fence it
        # first applies again every entry it kept): the checker reads the ledger after.
        unapplied = await drill.ledger_drained(LEDGER_DRAIN_S)
        fleet.stop()  # holders release their leases: every interval ends with its stop
        return await _report(
            runner,
            kinds,
            postgres.dsn(database),
            base / "logs",
            lease_faults.report(),
            controls,
            uins,
            unapplied,
            {"redis": "sentinel", **postgres.describe()},
        )
    finally:
        if load is not None:
            load.stop()
        if snowflakes is not None:
            snowflakes.stop()
        if fleet is not None:
            fleet.stop()
        topology.stop()
        postgres.stop()
        links.close()


def _fleet(
    settings: Settings,
    base: Path,
    postgres: PostgresStack,
    database: str,
    topology: Topology,
    controls: Controls,
    api_keys: list[dict[str, Any]],
) -> Fleet:
    config = base / "drill.yaml"
    types = {
        DRILL_TYPE: DRILL_TYPE_CONFIG,
        lifecycle.LIFECYCLE_TYPE: lifecycle.type_config(len(topology.servers) - 1),
        leases.SNOWFLAKE_TYPE: leases.SNOWFLAKE_TYPE_CONFIG,
    }
    dispenser = {
        "auth": {"api_keys": api_keys},
        "mosip": {"uin": lifecycle.LIFECYCLE_TYPE, "ledger_wait_s": 5},
    }
    # Every lease renewal is logged: the interval checks read each holder's deadlines.
    log_levels = {"shared.leases.holder": "DEBUG"}
    config.write_text(
        json.dumps(
            {
                "id_types": types,
                "keysync": DRILL_KEYSYNC | {"ledger_retain_s": postgres.ledger_retain_s},
                "dispenser": dispenser,
                "redis_namespace": DRILL_NAMESPACE,
                "log_levels": log_levels,
                "postgres_connect_timeout_s": 1.0,
                "lease_wait_replicas": 1 if controls.lease_wait else 0,
            }
        )
    )
    key = settings.permutation_key.get_secret_value() if settings.permutation_key else ""
    env = scrubbed_env(
        KD_CONFIG=str(config),
        KD_POSTGRES_DSN=postgres.dsn(database),
        KD_PERMUTATION_KEY=key or secrets.token_urlsafe(32),
        KD_REDIS_SENTINEL=json.dumps(
            {"sentinels": topology.sentinel_addresses(), "master_name": MASTER}
        ),
        KD_POSTGRES_FENCE=str(controls.postgres_fence).lower(),
    )
    (base / "logs").mkdir(exist_ok=True)
    return Fleet(base / "logs", env)


def _migrate(fleet: Fleet) -> str:
    done = run_cli("migrate", env=fleet.env, timeout_s=120)
    return "" if done.returncode == 0 else done.stderr


async def _report(
    runner: Runner,
    kinds: list[str],
    dsn: str,
    logs: Path,
    lease_report: leases.LeaseReport,
    controls: Controls,
    uins: LifecycleLoad,
    unapplied: int = 0,
    stack: dict[str, Any] | None = None,
) -> DrillReport:
    common = await common_fields(
        runner.rounds,
        runner.drill.load,
        uins,
        kinds=kinds,
        dsn=dsn,
        logs=logs,
        exits=runner.drill.fleet.exits,
        unapplied=unapplied,
        fence_rounds=[done for done in runner.rounds if done.fault in REDIS_FAULTS],
    )
    rows, ledger, uin_figures = common["faults"], common["ledger"], common["lifecycle"]
    fail_closed = await asyncio.to_thread(history.fail_closed_seconds, logs)
    by_fault: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = by_fault.setdefault(
            row["fault"], {"rounds": 0, "keys_discarded": 0, "resume_ms_max": 0}
        )
        entry["rounds"] += 1
        entry["keys_discarded"] += row["keys_discarded"]
        entry["resume_ms_max"] = max(entry["resume_ms_max"], row["resume_ms"])
    return DrillReport(
        **common,
        by_fault=by_fault,
        ledger_missing=ledger["missing"],
        ledger_used_missing=ledger["used_missing"],
        ledger_duplicate_alarms=ledger["duplicate_alarms"],
        ledger_lost_to_fault=ledger["lost_to_fault"],
        keys_in_two_hands=uin_figures["keys_in_two_hands"],
        status_changes_lost=uin_figures["status_changes_lost"],
        ledger_wrong_client=uin_figures["ledger_wrong_client"],
        fail_closed_s=round(sum(fail_closed.values()), 3),
        fail_closed_by_process=fail_closed,
        lease_renewals_unreplicated=history.count_events(logs, "lease_renew_unreplicated"),
        ledger_restores=history.count_events(logs, "ledger_restored_after_fence"),
        ledger_links_restored=history.sum_of(logs, "ledger_restored_after_fence", "links"),
        ledger_halts=history.count_events(logs, "ledger_halted"),
        lease_faults_not_observed=leases.not_observed(rows),
        leases=lease_report,
        postgres_fence=controls.postgres_fence,
        lease_wait=controls.lease_wait,
        stack=stack or {},
    )


ROUND_COLUMNS = ("round", "fault", "keys_discarded", "outage_began_ms", "resume_ms")


def rounds_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per round (and a head): what each fault discarded and how long
    dispensing stopped."""
    line = "{:>5}  {:<26} {:>14} {:>15} {:>9}"
    return [line.format(*ROUND_COLUMNS)] + [
        line.format(*(row[k] for k in ROUND_COLUMNS)) for row in rows
    ]


def format_table(report: DrillReport) -> str:
    lines = [_stack_line(report.stack), *rounds_table(report.faults)]
    lines.append(f"keys dispensed {report.keys_dispensed}, duplicates {report.duplicates}")
    held = report.leases
    lines.append(
        f"snowflake IDs {held.snowflake_ids}, duplicates {held.snowflake_duplicates}; "
        f"lease intervals {held.lease_intervals}, overlaps {held.lease_overlaps}"
    )
    ledger = report.ledger
    lines.append(
        f"ledger rows {ledger['rows']}, missing {ledger['missing']}, used marks missing "
        f"{ledger['used_missing']} of {ledger['marked']}, lost to faults "
        f"{sum(ledger['lost_to_fault'].values())}, duplicate alarms "
        f"{ledger['duplicate_alarms']}"
    )
    uins = report.lifecycle
    lines.append(
        f"UIN lifecycle: {uins.get('uins_received', 0)} received, "
        f"{uins.get('uins_reissued', 0)} issued again, "
        f"{uins.get('status_changes_acknowledged', 0)} status changes; in two hands "
        f"{report.keys_in_two_hands}, changes lost {report.status_changes_lost}, under "
        f"another client {report.ledger_wrong_client}, missing {uins.get('ledger_missing', 0)}"
    )
    lines.append(
        f"PUT pairs at once {uins.get('put_pairs', 0)} (decided "
        f"{uins.get('put_pairs_decided', 0)}, both applied "
        f"{uins.get('put_pairs_both_applied', 0)}); acknowledged PUTs asked again "
        f"{uins.get('repeats', 0)} (answered otherwise {uins.get('repeats_contradicted', 0)})"
    )
    lines.append(
        f"ledger restores after PostgreSQL fences {report.ledger_restores} "
        f"({report.ledger_links_restored} links), halts {report.ledger_halts}"
    )
    lines.append(f"fail-closed {report.fail_closed_s} s; process exits {len(report.process_exits)}")
    for failure in report.failures():
        lines.append(f"FAILED: {failure}")
    return "\n".join(lines)


def _stack_line(stack: dict[str, Any]) -> str:
    """What ran, in one line (the report's ``stack``)."""
    shown = ", ".join(f"{key} {value}" for key, value in stack.items())
    return f"stack: {shown or 'unknown'}"

"""One run of the ledger's real code under simulated faults, drawn from a seed.

The world is the model's: one ledger type with ``reissue_released``, one key K in its
cold table, two API clients, one or two keysyncs (each a ledger drain and a refill, as
keysync's process runs them), and the faults a seed draws: PostgreSQL promotions that
lose commits, Redis failovers, restarts empty or from an older copy, keysyncs killed
and restarted, processes frozen past every timeout (so that another keysync claims
their batch), keysyncs stalled just after a commit, before its confirmation (their
batch applied again by another, a restore's link committed but not yet recorded), and
keysyncs killed there (restarted, they read their own pending batch again).

The code is the service's own: ``keysync.ledger.LedgerDrain`` and
``keysync.main.drain_ledger``, ``Keysync.refill``, the fence (``settle``), the hot
store's Lua, MOSIP's PUT (``dispenser.mosip._change``), the ledger's lookup
(``LedgerReader``), over the fakes of ``fake_redis`` and ``fake_postgres``. Subclasses
of the stores (``Traced...``) call the real method and then tell the ``Recorder`` what
happened; nothing of the service is changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from dispenser import mosip
from dispenser.metrics import DispenserMetrics
from dispenser.service import Dispenser, Stores
from keydispenser_ops.simulation.clock import Chance, Deadlock, VirtualLoop, patched
from keydispenser_ops.simulation.fake_postgres import SimPostgres, cold_store
from keydispenser_ops.simulation.fake_redis import SimRedis, endpoint
from keydispenser_ops.simulation.recorder import Recorder
from keysync.ledger import LedgerDrain
from keysync.main import Keysync, drain_ledger
from keysync.metrics import KeysyncMetrics
from shared.domain.config import Settings, load_settings
from shared.domain.errors import KeydispenserError
from shared.domain.idtypes import build_id_types
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import Record, SyncRecord
from shared.stores.groups import SyncRecords
from shared.stores.hot.hot_store import HotStore
from shared.stores.ledger.reader import LedgerReader
from shared.stores.ledger.stream import LedgerStream
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.redis.endpoint import RedisEndpoint

ACTOR: contextvars.ContextVar[str] = contextvars.ContextVar("actor", default="world")
INTENT: contextvars.ContextVar[str] = contextvars.ContextVar("intent", default="")
# What a keysync's ledger drain is doing: "requeue", "restore", or "" (a batch).
PHASE: contextvars.ContextVar[str] = contextvars.ContextVar("phase", default="")
# The link a restore was asked to restore up to.
RESTORING: contextvars.ContextVar[str] = contextvars.ContextVar("restoring", default="")
TYPE = "uin"
KEY = "8175680160"  # K: a valid UIN of the type (MOSIP's filters, Verhoeff; checked by a test)
CLIENTS = ("client-a", "client-b")
EMPTY_CONFIG = Path(__file__).with_name("empty.yaml")


# The world's type and keysync: short waits, so that faults outlast them.
TYPE_CONFIG: dict[str, Any] = {
    "kind": "numeric",
    "length": 10,
    "filter_profile": "mosip",
    "ledger": True,
    "reissue_released": True,
    "reissue_after_s": 1,
    "range_size": 1000,
    "hot": {"low": 1, "high": 2},
    "cold": {"low": 1, "high": 2},
    "sync_batch": 1,
}
KEYSYNC_CONFIG: dict[str, Any] = {
    "ledger_batch": 2,
    "ledger_retain_s": 4,
    "ledger_claim_idle_s": 2,
    "ledger_requeue_every_s": 3,
    "poll_interval_s": 0.5,
    "push_retry_s": 2,
}


# The fence's detection time (connect timeout + watch + read block) stays below the log's
# retention (the configuration refuses a shorter log); a short retention lets trims meet
# restores within a run.
CONNECT_TIMEOUT_S = 1.0


def settings(claim_idle_s: float = KEYSYNC_CONFIG["ledger_claim_idle_s"]) -> Settings:
    """The world's configuration (``claim_idle_s``: how long a batch waits before
    another keysync takes it over; a seed draws it)."""
    return load_settings(
        EMPTY_CONFIG,
        postgres_dsn="postgresql://simulation/kd",
        redis_url="redis://simulation/0",
        id_types={TYPE: TYPE_CONFIG},
        keysync={**KEYSYNC_CONFIG, "ledger_claim_idle_s": claim_idle_s},
        postgres_connect_timeout_s=CONNECT_TIMEOUT_S,
        dispenser={"mosip": {"uin": TYPE, "ledger_wait_s": 20}},
    )


@dataclass
class Fault:
    at: float  # seconds after the start
    # promote, redis_failover, redis_empty, redis_old, crash, pause, freeze, stall, die,
    # stall_answered
    kind: str
    # how far back (ledger transactions lost, Redis writes), which keysync, how long (s)
    arg: int = 0


KINDS = ("promote", "redis_failover", "redis_empty", "redis_old", "crash", "pause", "stall", "die")
WEIGHTS = (5, 3, 1, 1, 3, 3, 3, 3)  # each kind's weight among those a seed draws
# Each fault kind is drawn by a seed with this chance (swarm testing), and so many
# faults of the kinds drawn.
SWARM_KEEP = 0.5
FAULTS_PER_SEED = (0, 1, 2, 2, 3, 4)
# The share of seeds that also draw a keysync stalled across a promotion.
STALL_ACROSS_PROMOTION = 0.15
# The share of seeds that also draw two promotions in a row while the drains are frozen.
TWO_PROMOTIONS = 0.2


@dataclass
class Plan:
    """What a seed draws: the keysyncs, how long the clients act, the faults."""

    keysyncs: int
    active_s: float
    # A long claim lets a stalled batch be taken over only after the ledger moved on
    # (its release requeued and the key issued again): applied again, it must keep the
    # outcome decided first.
    claim_idle_s: float = 2.0
    faults: list[Fault] = field(default_factory=list)

    @classmethod
    def draw(cls, chance: Chance) -> Plan:
        rng = chance.rng
        plan = cls(keysyncs=rng.choice((1, 2)), active_s=rng.uniform(10, 40))
        plan.claim_idle_s = rng.choice((2.0, 2.0, 8.0))
        # Swarm testing: each seed draws from a random subset of the kinds, so that a
        # run often repeats one or two kinds of fault instead of mixing every kind once
        # (a fault that needs another of its kind first is then met far more often).
        swarm = [(k, w) for k, w in zip(KINDS, WEIGHTS, strict=True) if rng.random() < SWARM_KEEP]
        if not swarm:
            swarm = [(rng.choice(KINDS), 1)]
        kinds, weights = [k for k, _ in swarm], [w for _, w in swarm]
        for _ in range(rng.choice(FAULTS_PER_SEED)):
            kind = rng.choices(kinds, weights)[0]
            at = rng.uniform(2, plan.active_s)
            arg = {
                "promote": rng.choice((0, 1, 1, 2, 3, 5)),
                "redis_failover": rng.choice((0, 1, 2, 4, 8)),
                "redis_empty": 0,
                "redis_old": rng.choice((10, 30, 60)),
                "crash": rng.randint(1, plan.keysyncs),
                "pause": rng.choice((1, 3, 5, 12, 30)),
                "stall": rng.choice((3, 5, 8, 12, 15)),
                "die": rng.choice((8, 12, 15)),
            }[kind]
            plan.faults.append(Fault(at, kind, arg))
        if rng.random() < TWO_PROMOTIONS:
            # Two promotions in a row while the ledger drains are frozen (the refills
            # fence, nobody restores in between): the case a fence that restores only
            # up to the record's head gets wrong, rare among independent faults.
            at = rng.uniform(2, plan.active_s)
            plan.faults += [
                Fault(at, "freeze", rng.choice((5, 8, 12))),
                Fault(at + rng.uniform(0.2, 1), "promote", rng.choice((1, 2))),
                Fault(at + rng.uniform(1.5, 4), "promote", rng.choice((0, 1, 2))),
            ]
        if rng.random() < STALL_ACROSS_PROMOTION:
            # A keysync stalled between a commit it knows of and its confirmation while
            # PostgreSQL is promoted: its confirmation comes after the fence (refused,
            # it must change nothing: above all, trim nothing the restore needs).
            at = rng.uniform(2, plan.active_s)
            plan.faults += [
                Fault(at, "stall_answered", rng.choice((3, 5, 8))),
                Fault(at + rng.uniform(0.3, 2), "promote", rng.choice((0, 1, 2))),
            ]
        if any(f.kind == "die" for f in plan.faults):
            # Its batch is applied again after the ledger moved on (the release
            # requeued, the key issued anew), not claimed at once by the other keysync.
            plan.claim_idle_s = 8.0
        plan.faults.sort(key=lambda f: f.at)
        return plan


def lost_ledger_transactions(head: Any, lost: int) -> Any:
    """The commit a replica promoted now stops at when it lacks the primary's last
    ``lost`` ledger transactions (and every commit after the first of them)."""
    ancestors = head.ancestors()
    for commit in ancestors:
        if lost == 0:
            return commit
        if "GUARD_LEDGER" in commit.statements:
            lost -= 1
    return ancestors[-1]


# --- the stores, traced -----------------------------------------------------------------
# The recorder hears every Redis command and PostgreSQL commit as it happens on the
# server (the fakes tell it); these say only what the process is doing around one.

# Inside GuardedCold.record: the record read is the one a transaction is judged against.
JUDGING: contextvars.ContextVar[bool] = contextvars.ContextVar("judging", default=False)


class TracedGuard(GuardedCold):
    async def record(self, name: str) -> Record:
        token = JUDGING.set(True)
        try:
            return await super().record(name)
        finally:
            JUDGING.reset(token)


class TracedDrain(LedgerDrain):
    """The ledger drain, saying which of its transactions a record is read for."""

    async def requeue_released(self) -> dict[str, int]:
        token = PHASE.set("requeue")
        try:
            return await super().requeue_released()
        finally:
            PHASE.reset(token)

    async def restore(self, target: str) -> int:
        token, asked = PHASE.set("restore"), RESTORING.set(target)
        try:
            return await super().restore(target)
        finally:
            PHASE.reset(token)
            RESTORING.reset(asked)


# --- the world ------------------------------------------------------------------------


@dataclass
class Result:
    seed: int
    plan: Plan
    steps: list[tuple[str, int, int]]
    log: list[str]
    failure: str  # "" when the run held everywhere
    virtual_s: float


class World:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.chance = Chance(seed)
        self.plan = Plan.draw(self.chance)
        self.settings = settings(self.plan.claim_idle_s)
        self.types = build_id_types(self.settings, generating=False)
        self.paused: dict[str, float] = {}  # actor -> frozen until (loop time)
        # actor -> (how long it freezes, round trips let through first): a stall that
        # lets its commit's answer through freezes before its confirmation
        self.answered: dict[str, tuple[float, int]] = {}
        # actor -> (how long it freezes just after its next commit, the phase that
        # commit must be in: "restore", "release" (it gave a key back) or any, "",
        # whether it is killed there,
        # whether the commit's answer reaches it first) (a "stall" or "die" fault;
        # killed, it is restarted that long after)
        self.stalls: dict[str, tuple[float, str, bool, bool]] = {}
        self.loop: VirtualLoop | None = None
        self.redis = SimRedis(self._latency, self.chance.hex40)
        self.postgres = SimPostgres({TYPE: 1000}, self._latency)
        self.postgres.root.tables.cold[TYPE][KEY] = None
        # K came into the cold table as keys do, after keygen's guarded lease: the clock
        # row's last guarded write is on the first timeline (the model's node 0). A row
        # never guarded would let a vouch pass on a server promoted since (seed 1784),
        # a state no server holding cold keys is in.
        self.postgres.root.tables.clock["timeline"] = self.postgres.timeline
        self.recorder = Recorder(self, self.plan.keysyncs)
        self.postgres.listeners.append(self._stall_after_commit)
        self.stop = asyncio.Event()
        self.tasks: dict[str, asyncio.Task[None]] = {}

    # --- chance and time ------------------------------------------------------------

    def _latency(self) -> float:
        """A round trip's half: mostly fractions of a millisecond, now and then more;
        a frozen actor's next one lasts until it thaws."""
        rng = self.chance.rng
        delay = rng.expovariate(2000.0) if rng.random() < 0.97 else rng.uniform(0.005, 0.2)
        assert self.loop is not None
        actor = ACTOR.get()
        armed = self.answered.get(actor)
        if armed is not None:
            duration, through = armed
            if through:
                self.answered[actor] = (duration, through - 1)
            else:
                del self.answered[actor]
                self.paused[actor] = self.loop.time() + duration
        frozen = self.paused.get(actor, 0.0)
        return max(delay, frozen - self.loop.time())

    def _stall_after_commit(self, commit: Any, conn: Any) -> None:
        """A stalled actor freezes at once after its commit: its confirmation (the
        stamp recorded, the outcomes published, the entries acknowledged) waits while
        others act; its batch may be claimed and applied again meanwhile."""
        actor = ACTOR.get()
        stall = self.stalls.get(actor)
        if stall is None or "GUARD_LEDGER" not in commit.statements:
            return  # not a ledger transaction (a batch, a requeue, a restore)
        if stall[1] == "release":  # one that gave a key back (a PUT's release)
            before = commit.parent.tables.released if commit.parent else {}
            here = "release" if len(commit.tables.released) > len(before) else ""
        else:
            here = PHASE.get()
        if stall[1] in ("", here):
            del self.stalls[actor]
            if stall[2]:  # one death: the other keysyncs' arming goes with it
                for other in [a for a, armed in self.stalls.items() if armed is stall]:
                    del self.stalls[other]
            assert self.loop is not None
            if stall[3]:  # its commit's answer comes back first (one round trip)
                self.answered[actor] = (stall[0], 1)
                return
            self.paused[actor] = self.loop.time() + stall[0]
            if stall[2]:
                killer = contextvars.Context()
                self.loop.create_task(self._kill(actor, stall[0]), context=killer)

    async def _kill(self, actor: str, restart_after_s: float) -> None:
        """A keysync killed just after a commit, before it heard the commit's answer
        (its confirmation never sent); restarted under its name that long after."""
        ACTOR.set("faults")
        k = int(actor.rsplit("-", 1)[1])
        task = self.tasks.get(actor)
        if task is None or task.done() or self.stop.is_set():
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self.paused.pop(actor, None)
        self.recorder.on_crash(k)
        await asyncio.sleep(restart_after_s)
        if not self.stop.is_set():
            self.start(actor, self.drain(k))

    # --- the stores of each process -------------------------------------------------

    def endpoint(self) -> RedisEndpoint:
        return endpoint(self.redis)

    def cold(self) -> ColdStore:
        return cold_store(self.postgres, ACTOR.get)

    # --- actors -----------------------------------------------------------------------

    async def run(self) -> None:
        """The clients and keysyncs act for the plan's active time under its faults;
        then the faults stop and everything pending must be done within a quiet
        spell."""
        for k in range(1, self.plan.keysyncs + 1):
            self.start(f"keysync-{k}", self.drain(k))
            self.start(f"refill-{k}", self.refill(k))
        for name in CLIENTS:
            self.start(name, self.client(name))
        self.start("faults", self.faults())
        await asyncio.sleep(self.plan.active_s)
        self.recorder.clients_stop()
        self.stalls.clear()  # no fault from now on: a stall or death not yet met never is
        # The quiet end: everything pending must be done within QUIET_S (the model's
        # liveness); it ends as soon as it is (the rest would only idle).
        quiet_until = asyncio.get_running_loop().time() + QUIET_S
        while asyncio.get_running_loop().time() < quiet_until:
            await asyncio.sleep(QUIET_STEP_S)
            if self.recorder.failure or not self.recorder.mirror.settled():
                break
        self.stop.set()
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def start(self, actor: str, work: Awaitable[None]) -> None:
        async def as_actor() -> None:
            ACTOR.set(actor)
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a crash of the world itself: the run fails
                self.recorder.fail(f"{actor} crashed: {type(exc).__name__}: {exc}")

        self.tasks[actor] = asyncio.get_running_loop().create_task(as_actor())

    async def drain(self, k: int) -> None:
        endpoint = self.endpoint()
        ns = self.settings.redis_key_namespace
        stream = LedgerStream(endpoint, ns)
        sync = SyncRecord(endpoint, ns)
        cold = self.cold()
        guard = TracedGuard(cold, sync, self.types)
        config = self.settings.keysync
        drain = TracedDrain(
            stream,
            cold,
            self.types,
            f"keysync-{k}",
            config.ledger_batch,
            config.ledger_claim_idle_s,
            guard=guard,
            retain_s=config.ledger_retain_s,
            sync=sync,
        )
        metrics = KeysyncMetrics(CollectorRegistry())
        await drain_ledger(
            drain, metrics, stream.backlog, self.stop, prune_every_s=config.ledger_requeue_every_s
        )

    async def refill(self, k: int) -> None:
        endpoint = self.endpoint()
        ns = self.settings.redis_key_namespace
        hot = HotStore(endpoint, ns)
        guard = TracedGuard(self.cold(), SyncRecord(endpoint, ns), self.types)
        keysync = Keysync(self.settings, guard, hot)
        keysync.sleep = asyncio.sleep
        while not self.stop.is_set():
            with contextlib.suppress(KeydispenserError):
                await keysync.refill(self.types[TYPE])
            await asyncio.sleep(self.settings.keysync.poll_interval_s)

    def dispenser(self) -> Dispenser:
        endpoint = self.endpoint()
        ns = self.settings.redis_key_namespace
        hot = HotStore(endpoint, ns)
        stream = LedgerStream(endpoint, ns)
        records = SyncRecords.single(SyncRecord(endpoint, ns))
        reader = LedgerReader(self.settings.postgres_dsn, records)
        reader._store = self.cold()  # its pool, on the simulation's PostgreSQL
        stores = Stores(hot=hot, wake=_NoNudges(), ledger_stream=stream, ledger=reader)
        return Dispenser(self.settings, stores, DispenserMetrics(CollectorRegistry()))

    async def client(self, name: str) -> None:
        dispenser = self.dispenser()
        hot = dispenser.hot
        rng = self.chance.rng
        while self.recorder.clients_act:
            await asyncio.sleep(rng.uniform(0.05, 3.0))
            held, may_put = self.recorder.holds(name), self.recorder.may_put(name)
            choice = rng.random()
            with contextlib.suppress(KeydispenserError):
                if not held:
                    await hot.pop(TYPE, 1, [name], ledger=True)
                elif choice < 0.35 and may_put:
                    await self.put(dispenser, name, "ASSIGNED")
                elif choice < 0.6 and may_put:
                    await self.put(dispenser, name, "UNASSIGNED")
                elif choice < 0.85:
                    await self.lookup(dispenser, name)

    async def put(self, dispenser: Dispenser, name: str, status: str) -> None:
        INTENT.set("used" if status == "ASSIGNED" else "release")
        try:
            final = await mosip._change(dispenser, TYPE, KEY, status, name, False)
        except mosip.Refused as refused:
            self.recorder.on_put_done(name, refused.code[0])
        except KeydispenserError as exc:
            self.recorder.on_put_done(name, f"error: {exc}")
        else:
            self.recorder.on_put_done(name, final[1])  # the status MOSIP reports
        finally:
            INTENT.set("")

    async def lookup(self, dispenser: Dispenser, name: str) -> None:
        INTENT.set("lookup")
        try:
            found = await dispenser.ledger.lookup(TYPE, KEY)
        except KeydispenserError:
            self.recorder.on_lookup_done(name, None)
        else:
            self.recorder.on_lookup_done(name, found)
        finally:
            INTENT.set("")

    async def faults(self) -> None:
        started = asyncio.get_running_loop().time()
        for fault in self.plan.faults:
            wait = started + fault.at - asyncio.get_running_loop().time()
            await asyncio.sleep(max(wait, 0.0))
            await self.inject(fault)

    async def inject(self, fault: Fault) -> None:
        loop = asyncio.get_running_loop()
        if fault.kind == "promote":
            if self.recorder.mirror.srv == 0:
                return  # nothing the model's promotion starts from (ledger.pml: srv != 0)
            target = lost_ledger_transactions(self.postgres.head, fault.arg)
            self.recorder.on_promote(target)
            self.postgres.promote(target)
        elif fault.kind.startswith("redis_"):
            before = self.recorder.redis_view()
            if fault.kind == "redis_failover":
                self.redis.fail_over(fault.arg)
            elif fault.kind == "redis_empty":
                self.redis.restart(None)
            else:
                self.redis.restart(fault.arg)
            self.recorder.on_redis_loss(before, self.recorder.redis_view())
        elif fault.kind == "crash":
            actor = f"keysync-{fault.arg}"
            task = self.tasks.get(actor)
            if task is not None and not task.done():  # (not one killed, to be restarted)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self.recorder.on_crash(fault.arg)
                await asyncio.sleep(self.chance.rng.uniform(0.2, 3))
                self.start(actor, self.drain(fault.arg))
        elif fault.kind == "pause":
            victims = [a for a in self.tasks if a != "faults"]
            actor = self.chance.rng.choice(sorted(victims))
            self.paused[actor] = loop.time() + fault.arg
        elif fault.kind == "freeze":  # every ledger drain (their refills go on)
            for k in range(1, self.plan.keysyncs + 1):
                self.paused[f"keysync-{k}"] = loop.time() + fault.arg
        elif fault.kind in ("stall", "die", "stall_answered"):
            actor = f"keysync-{self.chance.rng.randint(1, self.plan.keysyncs)}"
            # Half the stalls wait for a restore's commit: its link committed, the
            # record still naming the restore pending, while the other keysync works.
            # A keysync dies after a transaction that gave a key back (its outcome not
            # yet published); restarted, it applies its batch again.
            if fault.kind == "stall":
                phase = self.chance.rng.choice(("", "restore"))
            else:
                phase = "release" if fault.kind == "die" else ""
            # Half the stalls freeze once the commit's answer came back (the process
            # knows it committed: its confirmation waits), half while it is in flight
            # (a promotion meanwhile loses the answer too).
            answered = fault.kind == "stall_answered" or (
                fault.kind == "stall" and self.chance.rng.random() < 0.5
            )
            stall = (float(fault.arg), phase, fault.kind == "die", answered)
            if fault.kind == "die":  # whichever keysync gives a key back first
                for k in range(1, self.plan.keysyncs + 1):
                    self.stalls[f"keysync-{k}"] = stall
            else:
                self.stalls[actor] = stall

    # --- one run --------------------------------------------------------------------

    def result(self) -> Result:
        loop = VirtualLoop()
        self.loop = loop
        started = loop.time()
        with patched(loop, self.chance), _quiet():
            try:
                loop.run_until_complete(self.run())
            except Deadlock as exc:
                self.recorder.fail(f"deadlock: {exc}")
            finally:
                loop.close()
        self.recorder.finish()
        return Result(
            self.seed,
            self.plan,
            self.recorder.steps,
            self.recorder.log,
            self.recorder.failure,
            loop.time() - started,
        )


QUIET_S = 40.0  # the quiet end: no new request, no fault; everything pending must end
QUIET_STEP_S = 2.0  # how often the quiet end looks whether it is over


class _NoNudges:
    """The dispenser's nudges to keysync: the world's refills poll."""

    async def nudge(self, name: str) -> None:
        return None

    async def close(self) -> None:
        return None


@contextlib.contextmanager
def _quiet() -> Any:
    """The service's log lines are not the run's: kept below warnings."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        root.setLevel(level)


Runner = Callable[[int], Result]


def run_seed(seed: int) -> Result:
    return World(seed).result()

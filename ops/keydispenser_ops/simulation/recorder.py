"""The trace of a run, checked against the model as it happens.

The stores (``world.Traced...``), the fakes (a PostgreSQL commit, a refusal, a
snapshot) and the world (a fault, a client's answer) tell the recorder what happened;
the recorder names it as the model's action with the model's choices (which client,
which keysync slot, which node a promotion goes back to...) and takes that step in the
``Mirror``. A step the model does not take from the state reached, an invariant the
model asserts, or a difference between what the code did and what the model says the
step does (the row a transaction wrote, the outcome it published, the answer a lookup
gave) fails the run, naming the step: the seed reproduces it.

The model's slots: keysync k's ledger drain is slot k (1, 2); the refills are slot 3
(a keysync's refill runs beside its drain, each a slot of its own: ledger.pml).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dispenser import codes
from keydispenser_ops.simulation.fake_postgres import Commit, SimConnection
from keydispenser_ops.simulation.mirror import (
    ACKED,
    IDLE,
    LOST,
    O_ASSIGNED,
    O_NOTFOUND,
    O_REFUSED,
    O_RELEASED,
    REL,
    TAKE_BEGUN,
    TAKEN,
    UNREAD,
    USE,
    Mirror,
    NotAnAction,
    Violation,
)
from keydispenser_ops.simulation.mirror import params as mirror_params
from shared.domain import outcomes, redis_keys
from shared.domain.tiers import Popped  # noqa: F401 (the traced stores' values)

if TYPE_CHECKING:
    from keydispenser_ops.simulation.world import World

REFILL_SLOT = Mirror.REFILL_SLOT
# The ledger's outcomes (shared/domain/outcomes.py) as the model names them.
OUTCOME = {
    outcomes.ASSIGNED: O_ASSIGNED,
    outcomes.UNASSIGNED: O_RELEASED,
    outcomes.UNUSED: O_RELEASED,
    outcomes.NOT_ISSUED: O_REFUSED,
    outcomes.NOT_FOUND: O_NOTFOUND,
}
# MOSIP's answers to a PUT (dispenser/mosip.py) as the model's outcomes.
ANSWER = {
    "ASSIGNED": O_ASSIGNED,
    "UNASSIGNED": O_RELEASED,
    "UNUSED": O_RELEASED,
    codes.UIN_NOT_ISSUED.code: O_REFUSED,
    codes.UIN_NOT_FOUND.code: O_NOTFOUND,
}


class Mismatch(AssertionError):
    """The code did something other than what the model's step does."""


class Recorder:
    def __init__(self, world: World, keysyncs: int) -> None:
        self.world = world
        self.mirror = Mirror.of_simulation(keysyncs)
        self.steps: list[tuple[str, int, int]] = []
        self.log: list[str] = []
        self.failure = ""
        self.clients_act = True
        self.entry_no: dict[str, int] = {}  # stream entry ID -> model entry
        self.node_of: dict[int, int] = {0: 0}  # concrete commit -> model node
        self.vouched: dict[str, int] = {}  # actor -> the node its VOUCH committed
        self.restore_read: dict[str, set[str]] = {}  # actor -> links its restore read
        self.deferred: set[str] = set()  # links lost after a restore read them
        self.adopted: dict[str, int] = {}  # actor -> the node its adoption's claim made
        self.link_node: dict[str, int] = {}  # ledger link ID -> model node
        self.seen_outcome: dict[str, str] = {}  # entry ID -> outcome a PUT read
        self.put_entry: dict[int, int] = {}  # client -> the entry of its PUT waiting
        self.claims: dict[str, str] = {}  # actor -> the mode of a claim before its commit
        self.refused: set[str] = set()  # actors whose last ledger guard refused
        world.postgres.listeners.append(self.on_commit)
        world.postgres.refusal_listeners.append(self.on_refused)
        world.postgres.begin_listeners.append(self.on_snapshot)
        world.redis.listeners.append(self.on_redis)
        self._newest: str | None = None  # the stream's newest entry, last seen
        self._log: set[str] = set()  # the ledger log's links, last seen

    # --- stepping the model -------------------------------------------------------------

    def step(self, action: str, p1: int = 0, p2: int = 0, note: str = "") -> Any:
        if self.failure:
            return None
        params = mirror_params(action, p1, p2)
        try:
            result = self.mirror.step(action, *params)
        except NotAnAction as exc:
            self.fail(
                f"not a step of the model: {action}({p1}, {p2}): {exc} [{self.mirror.describe()}]"
            )
            return None
        except Violation as exc:
            self.steps.append((action, p1, p2))
            self.fail(f"invariant broken by {action}({p1}, {p2}): {exc}")
            return None
        self.steps.append((action, p1, p2))
        self.log.append(f"{self._now():10.3f} {action}({p1}, {p2}) {note}".rstrip())
        return result

    def fail(self, why: str) -> None:
        if not self.failure:
            self.failure = why
            self.log.append(f"{self._now():10.3f} FAILED: {why}")

    def expect(self, cond: bool, why: str) -> None:
        if not cond:
            self.fail(f"the code and the model differ: {why}")

    def _now(self) -> float:
        loop = self.world.loop
        return loop.time() - 1_800_000_000.0 if loop is not None else 0.0

    # --- who is who ---------------------------------------------------------------------

    @staticmethod
    def client(actor: str) -> int:
        return {"client-a": 1, "client-b": 2}.get(actor, 0)

    @staticmethod
    def slot(actor: str) -> int:
        if actor.startswith("refill-"):
            return REFILL_SLOT
        if actor.startswith("keysync-"):
            return int(actor.rsplit("-", 1)[1])
        return 0

    def node(self, commit: Commit | None) -> int:
        """The model node of a commit: its own, or the nearest modelled ancestor's."""
        while commit is not None and commit.number not in self.node_of:
            commit = commit.parent
        return self.node_of.get(commit.number, 0) if commit is not None else 0

    # --- the clients --------------------------------------------------------------------

    def may_put(self, name: str) -> bool:
        """The model's clients PUT while they hold K, one PUT at a time (a release they
        gave up waiting for is not sent again)."""
        cl = self.mirror.clients[self.client(name)]
        return cl.hold == 1 and cl.pu == 0

    def holds(self, name: str) -> bool:
        c = self.client(name)
        return self.mirror.clients[c].hold in (1, 2, 3) or self.mirror.clients[c].pu != 0

    def clients_stop(self) -> None:
        self.clients_act = False

    # --- what each Redis command did, as it ran -------------------------------------

    def on_redis(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        from keydispenser_ops.simulation.world import ACTOR, INTENT, JUDGING, PHASE

        actor = ACTOR.get()
        self._appended(actor)
        script = name.removeprefix("script:")
        if name in ("xreadgroup", "xautoclaim", "xclaim"):
            self.on_read(actor, _delivered(name, result))
        elif (
            name == "xrevrange"
            and PHASE.get() == "restore"
            and _text(args[0]) == redis_keys.ledger_log_key(self._ns())
        ):  # the restore's walk of the log: what it read, it writes (a loss after it
            # does not take it from this restore)
            self.restore_read.setdefault(actor, set()).update(_link_ids(result))
        elif (
            name == "xrevrange"
            and INTENT.get() in ("used", "release")
            and _text(args[0]) == redis_keys.ledger_stream_key(self._ns())
        ):  # the PUT's look at the newest entry (not at the newest confirmation)
            newest = result[0][0] if result else None
            self.on_put_begin(actor, INTENT.get(), newest)
        elif (
            name == "xrange"
            and INTENT.get() in ("used", "release")
            and _text(args[0]) == redis_keys.ledger_stream_key(self._ns())
            and not result
        ):  # the PUT's wait ended (LedgerStream.applied: none of its entries left)
            self.on_put_caught(actor)
        elif script == "ledger_confirm":
            self.on_confirm(actor, str(result[0]))
        elif script == "push":
            self.on_push(actor, str(result[3]))
        elif script == "reset_record":
            self.on_claim(actor, str(args[1][5]), str(result[0]))
        elif script == "vouch_record":
            self.on_vouch(actor, str(result[0]))
        elif script == "halt_record":
            self.on_fence_halt(actor, str(args[1][0]) if args[1] else "")
        elif script == "ledger_halt" and args[1] and args[1][0]:
            self.on_ledger_halt(actor, str(args[1][0]))
        elif script == "read_record":
            pairs = [str(x) for x in result[1:]]
            record = dict(zip(pairs[::2], pairs[1::2], strict=True))
            if JUDGING.get():
                self.on_transaction_record(actor, PHASE.get(), record)
            elif INTENT.get() == "lookup":
                self.on_record_read(actor, record)
        if name == "xadd" or script == "ledger_confirm":
            self._log = self.log_ids() if name == "xadd" else self._log

    def _appended(self, actor: str) -> None:
        """Entries the command appended to the stream: a pop's issue, a PUT's change."""
        newest = self.newest_stream_id()
        if newest is None or newest == self._newest:
            return
        self._newest = newest
        for entry, fields in self.stream_entries():
            if entry in self.entry_no:
                continue
            c = self.client(actor)
            if fields.get("op") == "issue":
                self.step("pop", c, note=f"entry {entry}")
            elif c and self.mirror.clients[c].pu:
                if self.mirror.clients[c].pw:
                    # The PUT saw no entry to wait for (the model did: one acknowledged
                    # since, on the Redis the PUT read), so it did not read: its wait
                    # ends here.
                    self.step("put_caught", c, note="nothing to wait for")
                self.step("put_append", c, note=f"entry {entry}")
                self.put_entry[c] = self.mirror.ne - 1
            else:
                self.fail(f"an entry the model never appends: {entry} {fields} by {actor}")
                return
            self.entry_no[entry] = self.mirror.ne - 1

    def on_put_begin(self, actor: str, intent: str, newest: str | None) -> None:
        c = self.client(actor)
        if not c:
            return
        op = USE if intent == "used" else REL
        if self.mirror.clients[c].hold != 1 or self.mirror.clients[c].pu:
            return  # the model's clients PUT only while they hold K, one at a time
        self.step("put_begin", c, op)
        if not self.failure:
            seen = self.entry_no.get(newest, 0) if newest else 0
            self.expect(
                self.mirror.clients[c].pw >= seen,
                f"a PUT waits for entry {seen}, the model for {self.mirror.clients[c].pw}",
            )

    def on_put_caught(self, actor: str) -> None:
        c = self.client(actor)
        if c and self.mirror.clients[c].pu and self.mirror.clients[c].pw:
            self.step("put_caught", c)

    def on_put_done(self, actor: str, answer: str) -> None:
        c = self.client(actor)
        e = self.put_entry.pop(c, 0)
        if not c:
            return
        if not e:
            if self.mirror.clients[c].pu:
                self.step("abandon", c, note=answer)
            return
        o = ANSWER.get(answer)
        if o is None:
            self.step("give_up", e, note=answer)
            return
        self.step("answer", e, note=answer)
        if not self.failure:
            model = self.mirror.entries[e].outc
            self.expect(model == o, f"entry {e} answered {answer}, the model's outcome is {model}")

    def on_lookup_done(self, actor: str, found: dict[str, Any] | None) -> None:
        c = self.client(actor)
        cl = self.mirror.clients[c]
        if cl.lk == 1:
            # Refused before its snapshot (the record it read again untrusted, halted or
            # restoring: a Redis loss meanwhile): the model's snapshot step, then, if the
            # model took one, its answer refused.
            self.expect(found is None, "a lookup answered without a snapshot")
            if self.step("look_snapshot", c) and not self.failure:
                self.step("look_answer", c, 1)
            return
        if cl.lk != 2:
            self.expect(found is None, "a lookup answered that the model never began")
            return
        snapshot = self.mirror.nodes[cl.ls]
        # Refused, it is the model's refusal or one of the code's own (an error): never
        # an answer the model would not give.
        answered = self.step("look_answer", c, int(found is None))
        if self.failure:
            return
        self.expect(bool(answered) == (found is not None), f"lookup answered: {found}")
        if found is not None and answered:
            live = snapshot.live
            owner = self.mirror.entries[live].cli if live else 0
            names = {1: "client-a", 2: "client-b"}
            # The ledger's lookup answers the key's row whoever asks (the routes hide
            # another client's issue; the world asks the reader itself).
            if live:
                self.expect(
                    found.get("client") == names.get(owner) and found.get("issued") is True,
                    f"lookup says {found}, the model's snapshot holds issue {live} of {owner}",
                )
                self.expect(bool(found.get("used")) == snapshot.used, f"lookup used: {found}")

    def on_record_read(self, actor: str, record: Any) -> None:
        """A lookup's first look at the record (the reader reads it more while waiting)."""
        c = self.client(actor)
        if not c or self.mirror.clients[c].lk != 0:
            return
        untrusted = record.get("untrusted") == "1" or not int(record.get("timeline", 0))
        if record.get("ledger_halt") or record.get("restore_from") or untrusted:
            return  # refused at once: 503 (the model's lookup is not enabled either)
        self.step("look_record", c)

    def on_snapshot(self, conn: SimConnection, readonly: bool) -> None:
        c = self.client(conn.actor)
        if not c or not readonly or self.mirror.clients[c].lk != 1:
            return
        # An adoption claimed and not committed yet (its transaction holds the clock
        # row): the snapshot sees the server as it was before the adoption's node.
        before = any(
            mode == "adopt" and self.adopted.get(actor) == self.mirror.srv
            for actor, mode in self.claims.items()
        )
        self.step(
            "look_snapshot",
            c,
            int(before),
            note=f"commit {conn.snapshot.number if conn.snapshot else -1}",
        )

    # --- keysync --------------------------------------------------------------------------

    def on_read(self, consumer: str, entries: list[str]) -> None:
        k = self.slot(consumer)
        numbers = [self.entry_no[e] for e in entries if e in self.entry_no]
        if not k or k == REFILL_SLOT or not numbers:
            return
        if self.mirror.ks[k].ks != 0:
            self.step("drop", k, note="a new turn: the last one was given up")
        owners = {self.mirror.entries[n].st for n in numbers}
        if owners - {UNREAD, 2 + k}:
            # Another's batch (live), or the entries it left pending (stopped, or between
            # its turns): claimed.
            victim = next(o - 2 for o in owners if 3 <= o <= 5 and o != 2 + k)
            self.step("claim", victim, note=f"by {k}: entries {numbers}")
            return
        self.step("read", k, len(numbers), note=f"entries {numbers}")

    def on_transaction_record(self, actor: str, phase: str, record: dict[str, str]) -> None:
        """The record a ledger transaction is judged against (``_transact``, the
        restore's; read again after a fence): the model's begin of that transaction."""
        k = self.slot(actor)
        if k == REFILL_SLOT:
            self.on_take_record(record)
            return
        if not k:
            return
        if record.get("untrusted") == "1" or not int(record.get("timeline", 0)):
            return  # GuardedCold.record fences (vouches) first, and reads it again
        if phase == "restore" and record.get("ledger_halt"):
            return  # a restore refuses a halted ledger at once (LedgerDrain.restore)
        state = self.mirror.ks[k].ks
        wanted = {"restore": ("rs_begin", 7), "requeue": ("rq_begin", 6)}.get(phase)
        if wanted is not None:
            action, begun = wanted
            if state not in (0, begun):
                # a batch held (its refusal runs the restore): kept in memory
                keep = int(phase == "restore" and state in (1, 2))
                self.step("drop", k, keep, note=f"the {phase}'s turn")
            if action == "rs_begin":
                from keydispenser_ops.simulation.world import RESTORING

                held = self.link_node.get(RESTORING.get(), 0)
                self.step(action, k, held)
            else:
                self.step(action, k)
        elif state in (1, 2):  # HOLDING, or BEGUN reading it again: a batch's
            self.step("begin", k)
        elif state == 0 and self.mirror.ks[k].kkeep:
            # The batch again after a restore its refusal ran in the same turn (the
            # restore took the keysync's slot): the batch it kept in memory.
            self.step("read", k, 3, note="its batch again, after a restore")
            self.step("begin", k)

    def on_take_record(self, record: dict[str, str]) -> None:
        """The record a refill's take is judged against: the model's take begun. Not one
        GuardedCold.record fences on first (and reads again) or refuses (halted); not
        one read for the next batch while the last is pushed (stepped at its commit)."""
        settle_first = ("untrusted", "fence_needed", "halted")
        if any(record.get(f) == "1" for f in settle_first) or int(record.get("claim_fences", 0)):
            return
        if not int(record.get("timeline", 0)):
            return
        if self.mirror.ks[REFILL_SLOT].ks in (IDLE, TAKE_BEGUN):
            self.step("take_begin", REFILL_SLOT)

    def on_refused(self, conn: SimConnection) -> None:
        k = self.slot(conn.actor)
        if not k:
            return
        action = {2: "commit", 6: "rq_commit", 7: "restore"}.get(self.mirror.ks[k].ks)
        if action is not None:
            committed = self.step(action, k, note="refused")
            self.expect(committed is False, "the guard refused what the model commits")
            if action == "restore":
                self.restore_ended(conn.actor)

    def on_commit(self, commit: Commit, conn: SimConnection) -> None:
        ran, actor = set(commit.statements), conn.actor
        k = self.slot(actor)
        if "GUARD_LEDGER" in ran:
            self._ledger_commit(commit, conn, ran)
        elif "TAKE_BATCH" in ran:
            if k == REFILL_SLOT:
                state = self.mirror.ks[REFILL_SLOT].ks
                if state == TAKEN:
                    self.step("drop", REFILL_SLOT, note="the last batch was never pushed")
                if state != TAKE_BEGUN:  # its record read while the last was pushed
                    self.step("take_begin", REFILL_SLOT, note="read while pushing")
                self.step("take", REFILL_SLOT)
                self.node_of[commit.number] = self.mirror.srv
        elif "RESET_SYNC_CLOCK" in ran:
            self.claims.pop(actor, None)
            self.node_of[commit.number] = self.mirror.srv  # the fence, taken at its claim
        elif "VOUCH" in ran:
            if self.claims.pop(actor, "") == "adopt":
                self.node_of[commit.number] = self.adopted.pop(actor, self.mirror.srv)
                self._compare(commit)
                return
            elif self.mirror.untrusted and not self.mirror.fhalted:
                self.step("vouch_commit")  # its record follows, rebuilt by vouch_record
                self.vouched[actor] = self.mirror.srv
            self.node_of[commit.number] = self.mirror.srv
        self._compare(commit)

    def _ledger_commit(self, commit: Commit, conn: SimConnection, ran: set[str]) -> None:
        k = self.slot(conn.actor)
        link = commit.tables.clock["ledger_heads"].get(self.world.settings.redis_key_namespace, "")
        if conn.restored:
            committed = self.step("restore", k)
            self.expect(committed is not False, "the code restored where the model refuses")
            self.restore_ended(conn.actor)
        elif "REQUEUE_RELEASED" in ran:
            committed = self.step("rq_commit", k, int(_requeued(commit)))
            self.expect(committed is not False, "the code requeued where the model refuses")
        else:
            committed = self.step("commit", k)
            self.expect(committed is not False, "the code committed what the model refuses")
        self.node_of[commit.number] = self.mirror.srv
        self.link_node[link] = self.mirror.srv
        if committed and link not in self.log_ids() and self.mirror.here.inlog:
            # logged before the commit, on a Redis that was lost in between
            self.step("loss_link", self.mirror.srv, note="logged on the Redis lost since")

    def restore_ended(self, actor: str) -> None:
        """The losses of links this restore had read, stepped now."""
        self.restore_read.pop(actor, None)
        still = set().union(*self.restore_read.values()) if self.restore_read else set()
        for link in sorted(self.deferred - still, key=lambda x: self.link_node.get(x, 0)):
            self.deferred.discard(link)
            node = self.link_node.get(link, 0)
            if node and self.mirror.nodes[node].inlog:
                self.step("loss_link", node, note="lost while a restore that read it ran")

    def on_logged(self, actor: str, link: str) -> None:
        return None

    def on_confirm(self, actor: str, status: str) -> None:
        k = self.slot(actor)
        now = self.log_ids()
        before, self._log = self._log, now
        # A refused confirmation changes nothing (ledger_confirm.lua), whatever the
        # model's keysync is doing: above all, it trims nothing.
        self.expect(
            status == "ok" or not before - now, f"a confirmation refused ({status}) trimmed the log"
        )
        if not k or self.mirror.ks[k].ks != 3:
            return
        if status == "untrusted" or (status == "halted" and self.mirror.untrusted):
            # Refused by a record Redis lost (to be rebuilt, or halted by the fence when
            # both tiers lost state): the model's confirmation is not enabled there, and
            # nothing changed.
            return
        ok = self.step("confirm", k, note=status)
        self.expect(bool(ok) == (status == "ok"), f"confirm said {status}, the model {ok}")
        self._trimmed(before - now)

    def _trimmed(self, links: set[str]) -> None:
        """Links a confirmation trimmed, oldest first, as the model's trims (a link the
        model holds no more: brought back by a restart from an older copy, or never
        committed, changes nothing)."""
        nodes = sorted(self.link_node[link] for link in links if link in self.link_node)
        for node in nodes:
            if self.failure or not self.mirror.nodes[node].inlog:
                continue
            oldest = min(n for n in range(1, self.mirror.nn) if self.mirror.nodes[n].inlog)
            self.expect(oldest == node, f"trimmed link {node}, the model's oldest is {oldest}")
            self.step("trim", note=f"link {node}")

    def on_push(self, actor: str, status: str) -> None:
        if self.slot(actor) != REFILL_SLOT or self.mirror.ks[REFILL_SLOT].ks != TAKEN:
            return
        if status in ("untrusted", "refused"):
            return  # tried again (after a vouch; pinned to the new server): not a step
        pushed = self.step("push", REFILL_SLOT, note=status)
        self.expect(bool(pushed) == (status in ("pushed", "duplicate")), f"push: {status}")

    def on_claim(self, actor: str, mode: str, status: str) -> None:
        if status != "ok":
            return
        if mode == "adopt":
            # The claim is the adoption's step: its transaction holds the clock row's
            # lock from before the claim to its commit, so no other guarded write
            # commits in between (a promotion in between loses it: the fence follows).
            self.claims[actor] = "adopt"
            self.step("adopt")
            self.adopted[actor] = self.mirror.srv
            return
        self.claims[actor] = mode
        self.step("fence")

    def on_vouch(self, actor: str, status: str) -> None:
        """A record rebuilt from PostgreSQL: the model's vouch (the first record of all,
        made before any guarded write, is the model's start: nothing to step)."""
        node = self.vouched.pop(actor, 0)
        if status == "ok" and self.mirror.untrusted:
            self.expect(node != 0, "a record rebuilt from a commit the model never made")
            self.step("vouch", node)

    def on_fence_halt(self, actor: str, reason: str) -> None:
        """Both tiers lost state (the fence halts leases and syncs): the model's vouch,
        which halts when PostgreSQL forked since its last guarded write."""
        if self.mirror.fhalted or not self.mirror.untrusted:
            return
        self.step("vouch", note=f"halted: {reason}")
        self.expect(self.mirror.fhalted, f"the fence halted ({reason}); the model vouches")

    def on_ledger_halt(self, actor: str, reason: str) -> None:
        """A restore found a link gone from the log: the model's restore halts too."""
        k = self.slot(actor)
        if not k or self.mirror.lhalted or self.mirror.ks[k].ks != 7:
            return
        self.step("restore", k, note=reason)
        self.expect(self.mirror.lhalted, f"the ledger halted ({reason}); the model restores")
        self.restore_ended(actor)

    def on_crash(self, k: int) -> None:
        self.restore_ended(f"keysync-{k}")
        ks = self.mirror.ks[k]
        busy = ks.ks != 0 or any(e.st == 2 + k for e in self.mirror.entries[1:])
        if busy:
            self.step("crash", k)

    # --- faults ---------------------------------------------------------------------------

    def on_promote(self, target: Commit) -> None:
        self.step("promote", self.node(target), note=f"commit {target.number}")

    def on_redis_loss(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        self._log = after["log"]
        self._newest = self.newest_stream_id()
        self.step("rloss", 4, 0)
        for entry, e in sorted(self.entry_no.items(), key=lambda item: item[1]):
            now = self._entry_state(entry, after)
            if now != self.mirror.entries[e].st and self.mirror.entries[e].st != LOST:
                self.step("loss_entry", e, now)
        for entry, e in sorted(self.entry_no.items(), key=lambda item: item[1]):
            lost = entry in before["outcomes"] and entry not in after["outcomes"]
            if lost and self.mirror.entries[e].outc and not self.mirror.entries[e].ans:
                self.step("loss_outcome", e)
        read = set().union(*self.restore_read.values()) if self.restore_read else set()
        for link in sorted(before["log"] - after["log"], key=lambda x: self.link_node.get(x, 0)):
            if link in self.link_node and self.mirror.nodes[self.link_node[link]].inlog:
                if link in read:
                    self.deferred.add(link)  # stepped once that restore has ended
                else:
                    self.step("loss_link", self.link_node[link])
        if not after["restore_from"] and self.mirror.rto:  # the model's, gone from Redis
            self.step("loss_restore", 0)
        if not after["ledger_halt"] and self.mirror.lhalted:
            self.step("loss_restore", 1, note="the ledger's halt")
        self.step("loss_end")

    def _entry_state(self, entry: str, view: dict[str, Any]) -> int:
        if entry in view["pending"]:
            return 2 + self.slot(view["pending"][entry])
        if entry in view["stream"]:
            return UNREAD
        return ACKED if _id(entry) <= view["last_id"] else LOST

    # --- what Redis holds -------------------------------------------------------------------

    def _db(self) -> dict[bytes, Any]:
        data: dict[bytes, Any] = self.world.redis.server.dbs[0]._dict
        return data

    def _key(self, name: str) -> bytes:
        return name.encode()

    def newest_stream_id(self) -> str | None:
        stream = self._db().get(self._key(redis_keys.ledger_stream_key(self._ns())))
        if stream is None or not stream.value._ids:
            return None
        return _key_text(stream.value._ids[-1])

    def stream_entries(self) -> list[tuple[str, dict[str, str]]]:
        """The stream's entries now, oldest first, with their fields."""
        stream = self._db().get(self._key(redis_keys.ledger_stream_key(self._ns())))
        if stream is None:
            return []
        found = []
        for key in stream.value._ids:
            raw = stream.value._values_dict[key]
            fields = {_text(a): _text(b) for a, b in zip(raw[::2], raw[1::2], strict=True)}
            found.append((_key_text(key), fields))
        return found

    def log_ids(self) -> set[str]:
        item = self._db().get(self._key(redis_keys.ledger_log_key(self._ns())))
        if item is None:
            return set()
        return {
            _text(dict(zip(v[::2], v[1::2], strict=True)).get(b"id", b""))
            for v in item.value._values_dict.values()
        }

    def redis_view(self) -> dict[str, Any]:
        """What a loss is measured by: the stream and who holds each entry, the log,
        the outcomes published, the record's pending restore."""
        ns, db = self._ns(), self._db()
        stream = db.get(self._key(redis_keys.ledger_stream_key(ns)))
        pending: dict[str, str] = {}
        ids: set[str] = set()
        last = (0, 0)
        if stream is not None:
            ids = {_key_text(i) for i in stream.value._ids}
            last = _tuple(stream.value._last_id)
            for group in stream.value._groups.values():
                for key, held in group.pel.items():
                    pending[_key_text(key)] = _text(held.consumer_name)
        prefix = redis_keys.ledger_outcome_key(ns, "").encode()
        found = {_text(k[len(prefix) :]) for k in db if k.startswith(prefix)}
        record = db.get(self._key(redis_keys.sync_record_key(ns)))
        restore = halt = b""
        if record is not None:
            restore = record.value.get(b"restore_from", b"")
            halt = record.value.get(b"ledger_halt", b"")
        return {
            "stream": ids,
            "pending": pending,
            "last_id": last,
            "log": self.log_ids(),
            "outcomes": found,
            "restore_from": bool(restore),
            "ledger_halt": bool(halt),
        }

    def _ns(self) -> str:
        return self.world.settings.redis_key_namespace

    # --- comparing ----------------------------------------------------------------------

    def _compare(self, commit: Commit) -> None:
        """K's ledger rows as the commit left them against the model's node."""
        if self.failure or self.node_of.get(commit.number) != self.mirror.srv:
            return
        from keydispenser_ops.simulation.world import KEY, TYPE

        node = self.mirror.here
        row = commit.tables.ledger[TYPE].get(KEY)
        live = self.entry_no.get(row["entry_id"], -1) if row else 0
        self.expect(live == node.live, f"K's live issue is {live}, the model's {node.live}")
        if row is not None:
            self.expect((row["used_at"] is not None) == node.used, f"K used: {row['used_at']}")
        released = {
            self.entry_no.get(r_entry, -1) for (t, k, r_entry) in commit.tables.released if k == KEY
        }
        model = {e for e in range(1, self.mirror.ne) if node.hist & (1 << e)}
        self.expect(released == model, f"K's released issues {released}, the model's {model}")
        self.expect((KEY in commit.tables.cold[TYPE]) == node.cold, "K in the cold table")

    # --- the end ----------------------------------------------------------------------------

    def finish(self) -> None:
        if self.failure:
            return
        left = self.mirror.settled()
        if left:
            self.fail("after the quiet end: " + "; ".join(left[:4]))


def _requeued(commit: Commit) -> bool:
    """Whether the commit requeued a release (its requeued_at set by it)."""
    before = commit.parent.tables.released if commit.parent is not None else {}
    return any(
        row["requeued_at"] is not None
        and (place not in before or before[place]["requeued_at"] is None)
        for place, row in commit.tables.released.items()
    )


def _link_ids(entries: list[tuple[Any, Any]]) -> set[str]:
    """The link ids of the ledger log's entries an XREVRANGE answered."""
    found = set()
    for _, fields in entries:
        values = {_text(k): _text(v) for k, v in dict(fields or {}).items()}
        found.add(values.get("id", ""))
    return found


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _key_text(key: Any) -> str:
    ts, seq = _tuple(key)
    return f"{ts}-{seq}"


def _tuple(key: Any) -> tuple[int, int]:
    return (int(key.ts), int(key.seq)) if hasattr(key, "ts") else (int(key[0]), int(key[1]))


def _id(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


def sort_links(links: Iterable[str], order: dict[str, int]) -> list[str]:
    return sorted(links, key=lambda link: order.get(link, 0))


def _delivered(name: str, result: Any) -> list[str]:
    """The entries a read handed its consumer (those deleted since come without fields)."""
    if not result:
        return []
    if name == "xreadgroup":
        pairs = [pair for _, entries in result for pair in entries]
    elif name == "xautoclaim":
        pairs = list(result[1])
    else:
        pairs = list(result)
    return [str(entry) for entry, fields in pairs if fields]

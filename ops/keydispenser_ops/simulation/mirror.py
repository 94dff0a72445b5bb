"""The ledger's protocol model (tests/model/ledger.pml), executable: the same state, the
same actions with the same enabling conditions and effects, the same invariants.

It checks a trace step by step: each step names an action and the choices the model
leaves open (which client, which keysync, which ancestor a promotion goes back to...);
``Mirror.step`` refuses a step the model does not enable from the state reached
(``NotAnAction``) and raises ``Violation`` where the model asserts. The simulation
drives it from the real code's runs (``simulation.trace``); ``simulation.spin`` replays
its traces in SPIN, so that the mirror and ledger.pml are known to agree.

Where ledger.pml bounds a world (entries, nodes, each action's budget) this has no bound:
a run of the real code may be as long as it likes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CA, CB = 1, 2
ISSUE, USE, REL = 1, 2, 3
UNREAD, ACKED, LOST = 1, 9, 10  # entry states; held by keysync k: 2 + k
O_ASSIGNED, O_RELEASED, O_REFUSED, O_NOTFOUND = 1, 2, 3, 4
T_ASSIGNED, T_RELEASED = 1, 2
IDLE, HOLDING, BEGUN, COMMITTED, TAKEN, TAKE_BEGUN, RQ_BEGUN, RS_BEGUN = 0, 1, 2, 3, 4, 5, 6, 7
OP_ISSUE, OP_USED, OP_REL, OP_REQ, OP_OUT = 16, 32, 48, 64, 80

# The action codes of ledger.pml (A_...), by name.
ACTIONS = {
    "pop": 1,
    "put_begin": 2,
    "pair": 3,
    "repeat": 4,
    "put_append": 5,
    "answer": 6,
    "give_up": 7,
    "read": 8,
    "claim": 9,
    "begin": 10,
    "commit": 11,
    "confirm": 12,
    "crash": 13,
    "take": 14,
    "push": 15,
    "rq_begin": 16,
    "rq_commit": 17,
    "adopt": 18,
    "fence": 20,
    "restore": 21,
    "trim": 22,
    "retry": 23,
    "rloss": 24,
    "vouch": 25,
    "promote": 26,
    "look_record": 27,
    "look_snapshot": 28,
    "look_answer": 29,
    "abandon": 30,
    "loss_entry": 31,
    "loss_outcome": 32,
    "loss_link": 33,
    "loss_restore": 34,
    "loss_end": 35,
    "drop": 36,
    "rs_begin": 37,
    "vouch_commit": 38,
    "take_begin": 39,
    "put_caught": 40,
}


TWO_PARAMS = (
    "put_begin",
    "read",
    "rloss",
    "loss_entry",
    "look_snapshot",
    "look_answer",
    "rs_begin",
    "rq_commit",
    "drop",
)
NO_PARAMS = ("fence", "trim", "vouch_commit", "adopt", "loss_end")


def params(action: str, p1: int, p2: int) -> tuple[int, ...]:
    """The parameters of a trace's step its action takes (a step always has two)."""
    if action in TWO_PARAMS:
        return (p1, p2)
    if action in NO_PARAMS:
        return ()
    return (p1,)


class NotAnAction(AssertionError):
    """A step the model does not take from the state the trace reached."""


class Violation(AssertionError):
    """A step after which one of the model's invariants fails."""


def bit(e: int) -> int:
    return 1 << e


@dataclass
class Node:
    """A commit: the state after it (ledger.pml's per-node arrays)."""

    par: int
    tl: int
    live: int = 0
    used: bool = False
    hist: int = 0
    req: int = 0
    cold: bool = False
    lhead: int = 0
    lprev: int = 0
    rest: int = 0
    pto: int = 0
    ents: int = 0
    app: int = 0
    ops: list[int] = field(default_factory=list)
    rlinks: int = 0
    held: int = 0
    inlog: bool = False
    gone: int = 0
    isfence: bool = False
    isvouch: bool = False  # made by VOUCH (a record may be rebuilt from it)
    isadopt: bool = False  # an adoption's commit (its claim came first)
    dv: dict[int, int] = field(default_factory=dict)


@dataclass
class Entry:
    op: int
    cli: int
    iss: int = 0
    st: int = UNREAD
    ans: bool = False
    outc: int = 0


@dataclass
class Keysync:
    ks: int = IDLE
    kb: int = 0
    krec: int = 0
    knode: int = 0
    ktarget: int = 0
    kkeep: int = 0  # a batch kept in memory across a restore its turn ran


@dataclass
class Client:
    hand: int = 0
    hold: int = 0
    moved: bool = False
    pu: int = 0
    pw: int = 0
    lk: int = 0
    lr: int = 0
    ls: int = 0
    lmin: int = 0
    lthen: int = 0
    idem: int = 0
    lastans: int = 0


class Mirror:
    """ledger.pml's state, and one method per action (``step`` dispatches by name)."""

    REFILL_SLOT = 3  # ledger.pml's slot of a keysync's refill (take, push)

    @classmethod
    def of_simulation(cls, keysyncs: int) -> Mirror:
        """The mirror of a simulated run: its keysyncs' drains, and the refill's slot."""
        mirror = cls(keysyncs=keysyncs)
        while len(mirror.ks) <= cls.REFILL_SLOT:
            mirror.ks.append(Keysync())
        return mirror

    def __init__(self, keysyncs: int = 2, clients: int = 2) -> None:
        self.nodes: list[Node] = [Node(par=0, tl=1, cold=True)]
        self.entries: list[Entry] = [Entry(0, 0)]  # entry 0: none
        self.ks = [Keysync() for _ in range(keysyncs + 1)]  # index 1..keysyncs
        self.clients = [Client() for _ in range(clients + 1)]
        self.nks, self.ncl = keysyncs, clients
        self.kso: dict[int, int] = {}
        self.truth: dict[int, int] = {}
        self.srv = 0
        self.curtl = 1
        self.rec = 0
        self.rhead = 0
        self.rto = 0
        self.fhalted = False
        self.lhalted = False
        self.hot = False
        self.twice = False
        self.untrusted = False
        self.rflost = False
        # The step before was an accepted confirmation or one of its trims
        # (ledger_confirm.lua trims in the confirmation's own script).
        self.trimok = False
        self.inloss = False
        self.seen = 0

    # --- helpers (ledger.pml's inlines) ---------------------------------------------

    @property
    def ne(self) -> int:
        return len(self.entries)

    @property
    def nn(self) -> int:
        return len(self.nodes)

    def node(self, n: int) -> Node:
        return self.nodes[n]

    @property
    def here(self) -> Node:
        return self.nodes[self.srv]

    def newnode(self) -> int:
        p = self.here
        n = Node(
            par=self.srv,
            tl=self.curtl,
            live=p.live,
            used=p.used,
            hist=p.hist,
            req=p.req,
            cold=p.cold,
            lhead=p.lhead,
            pto=p.pto,
            app=p.app,
            held=p.held,
            dv=dict(p.dv),
        )
        self.nodes.append(n)
        self.srv = len(self.nodes) - 1
        return self.srv

    def covers(self, b: int, a: int) -> bool:
        t = b
        while True:
            if t == a:
                return True
            if t == 0:
                return False
            t = self.nodes[t].par

    def onchain(self, x: int) -> bool:
        return x == 0 or (self.here.held & bit(x)) != 0

    @property
    def behind(self) -> bool:
        return not self.covers(self.srv, self.rec)

    def on_timeline(self, x: int) -> bool:
        return self.curtl == self.nodes[x].tl

    @property
    def frontier(self) -> int:
        f = 0
        for e in range(1, self.ne):
            if self.entries[e].st in (ACKED, LOST):
                f = e
            else:
                break
        return f

    def newest(self) -> int:
        found = 0
        for e in range(1, self.ne):
            if self.entries[e].st not in (ACKED, LOST):
                found = e
        return found

    def answerable(self) -> list[int]:
        return [
            e
            for e in range(1, self.ne)
            if self.entries[e].op != ISSUE and not self.entries[e].ans and self.entries[e].outc
        ]

    def stranded(self) -> list[int]:
        return [
            e
            for e in range(1, self.ne)
            if self.entries[e].op != ISSUE
            and not self.entries[e].ans
            and not self.entries[e].outc
            and self.entries[e].st in (LOST, ACKED)
        ]

    @property
    def guard_passes(self) -> bool:
        return not self.fhalted and not self.untrusted

    def requeue_due(self) -> bool:
        return (self.here.hist & ~self.here.req) != 0

    def ledger_node(self) -> int:
        n = self.newnode()
        node = self.here
        node.lprev, node.lhead, node.ents, node.ops = node.lhead, n, 0, []
        node.held |= bit(n)
        node.inlog = True
        return n

    def wrote(self, op: int) -> None:
        self.here.ops.append(op)

    def record(self, n: int) -> bool:
        if self.covers(n, self.rec):
            self.rec, self.rhead = n, self.nodes[n].lhead
            return True
        t = self.rec
        while True:
            if t == n:  # recorded before: on the record's timeline only ('stale' else)
                return self.nodes[n].tl == self.nodes[self.rec].tl
            if t == 0 or self.nodes[t].isfence:
                return False
            t = self.nodes[t].par

    def check(self, cond: bool, what: str) -> None:
        if not cond:
            raise Violation(what)

    def enabled(self, cond: bool, what: str) -> None:
        if not cond:
            raise NotAnAction(what)

    # --- deciding a batch -------------------------------------------------------------

    def decide_issue(self, e: int) -> None:
        """INSERT_LEDGER_ISSUED, SELECT_ISSUED_TWICE: inserted unless given back since
        (an entry applied again) or K's row is taken (by another: the alarm)."""
        h = self.here
        if h.live == e or h.hist & bit(e):
            return
        if h.live == 0:
            h.live, h.used = e, False
            self.wrote(OP_ISSUE + e)
        else:
            self.twice = True
            raise Violation(f"K issued twice: entry {e} while issue {h.live} is live")

    def apply_mark(self, e: int) -> None:
        h, entry = self.here, self.entries[e]
        if h.live and self.entries[h.live].cli == entry.cli and not h.used and h.live < e:
            if entry.op == USE:
                h.used = True
                self.wrote(OP_USED)
            else:
                h.hist |= bit(h.live)
                h.live = 0
                self.wrote(OP_REL)

    def outcome_now(self, e: int) -> int:
        h, entry = self.here, self.entries[e]
        if h.live and self.entries[h.live].cli == entry.cli:
            return O_ASSIGNED if entry.op == USE and h.used else O_REFUSED
        if h.live:
            return O_NOTFOUND
        last = max((t for t in range(1, self.ne) if h.hist & bit(t)), default=0)
        if last and self.entries[last].cli == entry.cli:
            return O_RELEASED if entry.op == REL else O_REFUSED
        return O_NOTFOUND

    def decide_batch(self, k: int) -> None:
        kb = self.ks[k].kb
        mine = [e for e in range(1, self.ne) if kb & bit(e)]
        for e in mine:
            if self.entries[e].op == ISSUE:
                self.decide_issue(e)
        for e in mine:
            if self.entries[e].op != ISSUE and not self.here.dv.get(e):
                self.apply_mark(e)
        for e in mine:
            if self.entries[e].op == ISSUE:
                continue
            if self.here.dv.get(e):
                self.kso[e] = self.here.dv[e]
            else:
                o = self.outcome_now(e)
                self.kso[e] = o
                self.here.dv[e] = o
                self.wrote(OP_OUT + e)
        self.here.ents = kb
        self.here.app |= kb

    def answered(self, e: int, i: int, o: int) -> None:
        op = self.entries[e].op
        if o == O_ASSIGNED:
            self.check(self.truth.get(i) != T_RELEASED, "ASSIGNED after a release was answered")
            self.truth[i] = T_ASSIGNED
        elif o == O_RELEASED:
            self.check(self.truth.get(i) != T_ASSIGNED, "released after ASSIGNED was answered")
            self.truth[i] = T_RELEASED
        elif o == O_REFUSED and op == USE:
            self.check(self.truth.get(i) != T_ASSIGNED, "ASSIGNED refused after it was answered")
            self.truth[i] = T_RELEASED
        elif o == O_REFUSED and op == REL:
            self.check(self.truth.get(i) != T_RELEASED, "release refused after it was answered")
            self.truth[i] = T_ASSIGNED
        else:
            self.check(self.entries[i].st == LOST, "not found for a key the client was given")

    # --- the restore ----------------------------------------------------------------

    def chain_intact(self, x: int) -> tuple[bool, int]:
        m = x
        while True:
            if m == 0:
                return self.here.lhead == 0, m
            if self.onchain(m):
                return True, m
            if not self.nodes[m].inlog:
                return False, m
            m = self.nodes[m].lprev

    def replay_link(self, q: int) -> None:
        h, link = self.here, self.nodes[q]
        for x in link.ops:
            if OP_ISSUE <= x < OP_USED:
                if not h.live:
                    h.live, h.used = x - OP_ISSUE, False
            elif x == OP_USED:
                if h.live:
                    h.used = True
            elif x == OP_REL:
                if h.live:
                    h.hist |= bit(h.live)
                    h.live = 0
            elif x == OP_REQ:
                h.req |= link.hist
            elif x >= OP_OUT:
                h.dv[x - OP_OUT] = link.dv.get(x - OP_OUT, 0)
        h.ents |= link.ents
        h.app |= link.ents

    def restore_ops(self, x: int) -> None:
        lost, q = 0, x
        while not self.onchain(q):
            lost |= bit(q)
            q = self.nodes[q].lprev
        self.here.held |= lost
        for i in range(1, self.nn):
            if lost & bit(i) and self.nodes[i].rlinks:
                lost = (lost & ~bit(i)) | self.nodes[i].rlinks
        self.here.rlinks = lost
        for i in range(1, self.nn):
            if lost & bit(i):
                self.replay_link(i)

    # --- the actions ----------------------------------------------------------------

    def pop(self, c: int) -> None:
        self.enabled(self.hot, "pop: K is not in the hot list")
        for u in range(1, self.ncl + 1):
            self.check(self.clients[u].hold != 1, "K handed to a client while another holds it")
            if self.clients[u].hold == 2:
                self.clients[u].moved = True
        self.hot = False
        self.entries.append(Entry(ISSUE, c))
        cl = self.clients[c]
        cl.hand, cl.hold, cl.moved, cl.idem, cl.lastans = self.ne - 1, 1, False, self.ne - 1, 0

    def put_begin(self, c: int, op: int) -> None:
        cl = self.clients[c]
        self.enabled(cl.hold == 1 and cl.pu == 0, "put: the client does not hold K")
        cl.pu, cl.pw = op, self.newest()

    def put_caught(self, c: int) -> None:
        """A PUT's wait ends (``_caught_up``): every entry up to the one it saw is
        applied; it waits for nothing more."""
        cl = self.clients[c]
        self.enabled(cl.pu != 0 and cl.pw != 0, "caught up: not waiting")
        self.enabled(cl.pw <= self.frontier, "caught up: an entry it waits for is pending")
        cl.pw = 0

    def put_append(self, c: int) -> None:
        cl = self.clients[c]
        self.enabled(cl.pu != 0 and cl.pw == 0, "append: before its wait ended")
        self.entries.append(Entry(cl.pu, c, cl.hand))
        if cl.pu == REL:
            cl.hold, cl.idem = 2, 0
        cl.pu, cl.pw = 0, 0

    def answer(self, e: int) -> None:
        self.enabled(e in self.answerable(), f"answer: entry {e} has no outcome published")
        entry = self.entries[e]
        entry.ans = True
        c = entry.cli
        cl = self.clients[c]
        self.answered(e, entry.iss, entry.outc)
        if entry.iss == cl.hand:
            cl.lastans = e
        if entry.op == REL and cl.hold >= 2 and entry.iss == cl.hand:
            if entry.outc == O_RELEASED:
                cl.hold = 0
            else:
                self.check(not cl.moved, "a release refused after K went to another client")
                cl.hold = 1

    def give_up(self, e: int) -> None:
        """A PUT answered 503 after ledger_wait_s: given up (whatever became of it)."""
        self.enabled(
            0 < e < self.ne and self.entries[e].op != ISSUE and not self.entries[e].ans,
            f"give up: entry {e} is no PUT waiting",
        )
        entry = self.entries[e]
        entry.ans = True
        cl = self.clients[entry.cli]
        if entry.op == REL and cl.hold == 2 and entry.iss == cl.hand:
            cl.hold = 3

    def abandon(self, c: int) -> None:
        """A PUT answered 503 before it appended its change."""
        cl = self.clients[c]
        self.enabled(cl.pu != 0, "abandon: no PUT begun")
        cl.pu, cl.pw = 0, 0

    def read(self, k: int, count: int) -> None:
        ks = self.ks[k]
        if count == 3:
            self.enabled(ks.ks == IDLE and ks.kkeep != 0, "read: no batch kept")
            ks.kb, ks.kkeep, ks.ks = ks.kkeep, 0, HOLDING
            return
        own = [e for e in range(1, self.ne) if self.entries[e].st == 2 + k]
        unread = [e for e in range(1, self.ne) if self.entries[e].st == UNREAD]
        # The watch (a halt refuses, a restore pending comes first) came before a read
        # that may block across a fence or a halt: what it delivers, the guard judges.
        self.enabled(ks.ks == IDLE and bool(own or unread), "read: nothing to read")
        if own:
            ks.kb = sum(bit(e) for e in own)
        else:
            e = unread[0]
            t = e + 1  # the next entry the stream still holds (one Redis lost is skipped)
            while t < self.ne and self.entries[t].st == LOST:
                t += 1
            if count == 2:
                self.enabled(t < self.ne and self.entries[t].st == UNREAD, "read: one")
            self.entries[e].st, ks.kb = 2 + k, bit(e)
            if count == 2:
                self.entries[t].st = 2 + k
                ks.kb |= bit(t)
        ks.ks = HOLDING

    def claim(self, k: int) -> None:
        """Keysync ``3 - k`` takes ``k``'s live batch, or every entry ``k`` left pending
        while it holds no batch (stopped, between turns, or restoring) (XAUTOCLAIM after
        ledger_claim_idle_s)."""
        ks, other = self.ks[k], self.ks[3 - k]
        owned = [e for e in range(1, self.ne) if self.entries[e].st == 2 + k]
        live = HOLDING <= ks.ks <= COMMITTED and ks.kb != 0
        self.enabled(
            (live or (ks.kb == 0 and bool(owned))) and other.ks == IDLE,
            "claim: no batch to take",
        )
        u = 3 - k
        if not live:
            for e in owned:
                self.entries[e].st = 2 + u
            other.kb, other.ks = sum(bit(e) for e in owned), HOLDING
            return
        for e in range(1, self.ne):
            if ks.kb & bit(e) and self.entries[e].st == 2 + k:
                self.entries[e].st = 2 + u
        other.kb, other.ks = ks.kb, HOLDING

    def begin(self, k: int) -> None:
        ks = self.ks[k]
        self.enabled(
            not self.fhalted and not self.untrusted and ks.ks in (HOLDING, BEGUN),
            "begin: not holding",
        )
        ks.krec, ks.ks = self.rec, BEGUN

    def commit(self, k: int) -> bool:
        """True when it committed, False when the guard refused."""
        ks = self.ks[k]
        self.enabled(ks.ks == BEGUN, "commit: no transaction begun")
        passes = (
            self.covers(self.srv, ks.krec)
            and self.on_timeline(ks.krec)
            and self.here.pto == 0
            and not self.fhalted
        )
        if not passes:
            ks.ks, ks.krec = HOLDING, 0
            return False
        self.ledger_node()
        self.decide_batch(k)
        ks.ks, ks.knode = COMMITTED, self.srv
        return True

    def confirm(self, k: int) -> bool:
        ks = self.ks[k]
        self.enabled(not self.untrusted and ks.ks == COMMITTED, "confirm: nothing committed")
        n = ks.knode
        ok = self.record(n)
        if ok:
            # Any link the record accepts is the restore pending or follows it.
            self.rto = 0
            for e in range(1, self.ne):
                entry = self.entries[e]
                if ks.kb & bit(e):  # an entry Redis lost since it was read: published too
                    if entry.st != LOST:
                        entry.st = ACKED
                    if entry.op != ISSUE and not entry.outc:
                        entry.outc = self.kso[e]
        ks.ks, ks.kb, ks.krec, ks.knode = IDLE, 0, 0, 0
        return ok

    def drop(self, k: int, keep: int = 0) -> None:
        """A keysync gives its turn up (an error): its batch dropped, its entries still
        pending under it (read first at its next turn). ``keep`` 1: the batch kept in
        memory while a restore its refusal needs runs first (``read`` 3 takes it up)."""
        ks = self.ks[k]
        self.enabled(ks.ks != IDLE, "drop: nothing held")
        if keep:
            ks.kkeep = ks.kb
        ks.ks, ks.kb, ks.krec, ks.knode, ks.ktarget = IDLE, 0, 0, 0, 0

    def crash(self, k: int) -> None:
        """A keysync dies: what it read stays pending under it (read first when it
        restarts under the same name, or claimed by another)."""
        ks = self.ks[k]
        busy = ks.ks != IDLE or any(e.st == 2 + k for e in self.entries)
        self.enabled(busy, "crash: nothing to lose")
        ks.ks, ks.kb, ks.krec, ks.knode, ks.ktarget = IDLE, 0, 0, 0, 0

    def take_begin(self, k: int) -> None:
        """A take's record read (GuardedCold.record), the record its guard is judged
        against."""
        self.enabled(
            self.guard_passes and self.ks[k].ks in (IDLE, TAKE_BEGUN),
            "take: the refill is busy, or the record is halted or untrusted",
        )
        self.ks[k].krec, self.ks[k].ks = self.rec, TAKE_BEGUN

    def take(self, k: int) -> None:
        """The take's transaction, its guard judged against the record read before."""
        ks = self.ks[k]
        self.enabled(
            ks.ks == TAKE_BEGUN and self.here.cold and self.covers(self.srv, ks.krec),
            "take: K is not in the cold table, or the guard refuses",
        )
        self.newnode()
        self.here.cold = False
        ks.ks, ks.knode, ks.krec = TAKEN, self.srv, 0

    def push(self, k: int) -> bool:
        self.enabled(
            self.ks[k].ks == TAKEN and not self.untrusted, "push: nothing taken, or untrusted"
        )
        ok = self.record(self.ks[k].knode)
        if ok:
            self.hot = True
        self.ks[k].ks, self.ks[k].knode = IDLE, 0
        return ok

    def rq_begin(self, k: int) -> None:
        self.enabled(
            not self.fhalted and not self.untrusted and self.ks[k].ks in (IDLE, RQ_BEGUN),
            "requeue: the keysync is busy, or the guard refuses",
        )
        self.ks[k].krec, self.ks[k].ks = self.rec, RQ_BEGUN

    def rq_commit(self, k: int, moved: int = 0) -> bool:
        """The requeue's transaction; ``moved`` 1: it found the release due (older than
        reissue_after_s) and requeued it, 0: nothing due yet (an empty link)."""
        ks = self.ks[k]
        self.enabled(ks.ks == RQ_BEGUN, "requeue: not begun")
        passes = (
            self.covers(self.srv, ks.krec)
            and self.on_timeline(ks.krec)
            and self.here.pto == 0
            and not self.fhalted
        )
        if not passes:
            ks.ks, ks.krec = IDLE, 0
            return False
        if moved and not self.requeue_due():
            raise NotAnAction("requeue: no release to requeue")
        self.ledger_node()
        if moved:
            if not self.here.live:
                self.here.cold = True
            self.here.req = self.here.hist
            self.wrote(OP_REQ)
        ks.ks, ks.knode, ks.kb = COMMITTED, self.srv, 0
        return True

    def adopt(self) -> None:
        """A promoted server's timeline taken up (its claim and its guarded write)."""
        self.enabled(
            self.nodes[self.rec].tl != self.curtl and self.guard_passes and not self.behind,
            "adopt: nothing to take up",
        )
        self.newnode()
        self.here.isadopt = True
        self.rec, self.rhead = self.srv, self.here.lhead

    def fence(self) -> None:
        self.enabled(self.guard_passes and self.behind, "fence: the primary is not behind")
        self.newnode()
        h = self.here
        h.isfence, h.cold = True, False
        x = self.rto or self.rhead
        if x and self.onchain(x):
            x = 0
        elif x:
            h.pto = x
        if self.rto == 0:
            self.rto = x
        self.rec, self.rhead = self.srv, h.lhead
        self.rflost = False

    def rs_begin(self, k: int, held: int = 0) -> None:
        """A restore begun: its target the record's pending restore, else the server's;
        with neither, ``held``: the target another keysync restored since this one saw
        it pending (a link the server holds now: nothing to write)."""
        ks = self.ks[k]
        self.enabled(
            (self.rto != 0 or self.here.pto != 0 or (held != 0 and self.onchain(held)))
            and not self.fhalted
            and not self.untrusted
            and not self.lhalted
            and ks.ks in (IDLE, RS_BEGUN),
            "restore: nothing pending, or the keysync is busy",
        )
        ks.krec, ks.ks, ks.ktarget = self.rec, RS_BEGUN, self.rto or self.here.pto or held

    def restore(self, k: int) -> bool:
        """True when a restore's link committed (or the ledger halted), False when the
        guard refused it."""
        ks = self.ks[k]
        self.enabled(ks.ks == RS_BEGUN, "restore: not begun")
        n = ks.ktarget
        # Its target pending no more (LedgerDrain._asked): nothing to walk or write.
        # Else the walk comes first, in the transaction; the guard after.
        moot = n not in (self.rto, self.here.pto)
        intact, m = (True, n) if moot else self.chain_intact(n)
        if not intact and not self.fhalted and not self.lhalted:
            self.check(
                self.nodes[m].gone in (1, 3),
                f"a halt for link {m}, which was neither trimmed before the fence nor lost",
            )
            self.lhalted = True
            ks.ks, ks.krec, ks.ktarget = IDLE, 0, 0
            return True
        passes = (
            self.covers(self.srv, ks.krec)
            and self.on_timeline(ks.krec)
            and self.here.pto in (0, ks.ktarget)
            and not self.fhalted
            and not self.lhalted
        )
        if not passes:
            ks.ks, ks.krec, ks.ktarget = IDLE, 0, 0
            return False
        self.ledger_node()
        if not moot:
            self.restore_ops(n)
        self.here.rest, self.here.pto = n, 0
        ks.ks, ks.knode, ks.kb, ks.ktarget = COMMITTED, self.srv, 0, 0
        return True

    def trim(self) -> None:
        self.enabled(self.trimok, "trim: no confirmation just accepted")
        self.enabled(self.rto == 0, "trim: a restore is pending")
        logged = [n for n in range(1, self.nn) if self.nodes[n].inlog]
        self.enabled(bool(logged), "trim: the log is empty")
        t = self.nodes[logged[0]]
        t.inlog = False
        if self.nodes[self.rec].tl != self.curtl or self.here.pto == 0:
            t.gone = 1  # no restore pending, or before the fence saw a promotion
        elif self.rflost:
            t.gone = 3
        else:
            t.gone = 2

    def rloss(self, kind: int, lost: int) -> None:
        self.hot = False
        for cl in self.clients[1:]:
            cl.idem = 0
        self.untrusted = True
        for node in self.nodes:  # a vouch committed before is 'stale' after (its epoch)
            node.isvouch = False
        if kind == 4:
            self.inloss = True  # the pieces follow (loss_entry, ...), then loss_end
            return
        if kind == 2:
            for entry in self.entries[1:]:
                if entry.st != ACKED:
                    entry.st = LOST
                if not entry.ans:
                    entry.outc = 0
            for node in self.nodes[1:]:
                if node.inlog:
                    node.inlog, node.gone = False, 3
            if self.rto:
                self.rflost = True
            self.rec = self.rhead = self.rto = 0
            self.lhalted = False
            return
        if lost & 1:
            for e in range(self.ne - 1, 0, -1):
                if self.entries[e].st not in (ACKED, LOST):
                    self.entries[e].st = LOST
                    break
        if lost & 2:
            for e in range(self.ne - 1, 0, -1):
                if self.entries[e].st == ACKED:
                    self.entries[e].st = UNREAD
                    break
        if lost & 4:
            for e in range(self.ne - 1, 0, -1):
                if self.entries[e].outc and not self.entries[e].ans:
                    self.entries[e].outc = 0
                    break
        if lost & 8:
            for n in range(self.nn - 1, 0, -1):
                if self.nodes[n].inlog:
                    self.nodes[n].inlog, self.nodes[n].gone = False, 3
                    break
        if lost & 16 and self.rto:
            self.rto, self.rflost = 0, True
        if lost & 16:
            self.lhalted = False

    def loss_entry(self, e: int, state: int) -> None:
        self.enabled(self.inloss and 0 < e < self.ne, "loss: not in a Redis loss")
        was = self.entries[e].st
        back = (
            state == LOST or (state == UNREAD and was != LOST) or (3 <= state <= 5 and was == ACKED)
        )
        self.enabled(back, f"loss: entry {e} from {was} to {state} is no loss")
        self.entries[e].st = state

    def loss_outcome(self, e: int) -> None:
        entry = self.entries[e]
        self.enabled(self.inloss and entry.outc != 0 and not entry.ans, "loss: no outcome")
        entry.outc = 0

    def loss_link(self, n: int) -> None:
        """A log entry lost with Redis; also after a loss, before the vouch: a link
        written to the Redis that was lost, its transaction committed after."""
        self.enabled(
            (self.inloss or self.untrusted) and 0 < n < self.nn and self.nodes[n].inlog,
            "loss: no link",
        )
        self.nodes[n].inlog, self.nodes[n].gone = False, 3

    def loss_restore(self, what: int) -> None:
        """The record's pending restore lost (``what`` 0), or the ledger's halt (1)."""
        if what == 1:
            self.enabled(self.inloss and self.lhalted, "loss: the ledger is not halted")
            self.lhalted = False
            return
        self.enabled(self.inloss and self.rto != 0, "loss: no restore pending")
        self.rto, self.rflost = 0, True

    def loss_end(self) -> None:
        self.enabled(self.inloss, "loss: not in a Redis loss")
        self.inloss = False

    def vouch(self, node: int = 0) -> None:
        """The record rebuilt from PostgreSQL. ``node`` 0: the verdict, VOUCH's commit
        (a node of its own) and the record at once (the model's search); else the
        record rebuilt from the node ``vouch_commit`` made (the code's two steps)."""
        self.enabled(
            self.untrusted and not self.fhalted,
            "vouch: the record is trusted",
        )
        if node and (node >= self.nn or not self.nodes[node].isvouch):
            raise NotAnAction(f"vouch: node {node} is no commit of VOUCH")
        if node == 0:
            if not (self.here.tl == self.curtl and self.covers(self.srv, self.rec)):
                self.fhalted = True
                return
            node = self.newnode()
        n = self.nodes[node]
        n.isvouch = False  # its record written once
        self.rec, self.rhead, self.rto = node, n.lhead, n.pto
        self.untrusted = False

    def vouch_commit(self) -> int:
        """VOUCH committed: the verdict (no fork since the server's last guarded write)
        under the clock row's lock, a guarded write of its own."""
        self.enabled(
            self.untrusted and not self.fhalted,
            "vouch commit: the record is trusted",
        )
        if not (self.here.tl == self.curtl and self.covers(self.srv, self.rec)):
            raise NotAnAction("vouch commit: the server forked since its last guarded write")
        node = self.newnode()
        self.nodes[node].isvouch = True
        return node

    def promote(self, to: int) -> None:
        self.enabled(self.srv != 0 and self.covers(self.srv, to), "promote: not an ancestor")
        self.srv, self.curtl = to, self.curtl + 1

    def look_record(self, c: int) -> None:
        cl = self.clients[c]
        self.enabled(
            cl.lk == 0 and not self.lhalted and self.rto == 0 and not self.untrusted,
            "lookup: refused (halted, restoring or the record untrusted)",
        )
        cl.lk, cl.lr, cl.lmin = 1, self.rec, self.seen
        cl.lthen = self.truth.get(cl.hand, 0)

    def look_snapshot(self, c: int, before_adopt: int = 0) -> bool:
        """The lookup's snapshot with the clock row; ``before_adopt`` 1: taken after an
        adoption's claim and before its commit (the server as it was before the
        adoption's node, which writes nothing of the ledger)."""
        cl = self.clients[c]
        self.enabled(cl.lk == 1, "lookup: no record read")
        self.enabled(not before_adopt or self.here.isadopt, "lookup: no adoption in flight")
        n = self.nodes[self.srv].par if before_adopt else self.srv
        if self.covers(n, cl.lr) and self.nodes[n].pto == 0:
            cl.lk, cl.ls = 2, n
            return True
        self._look_done(cl)
        return False

    def look_answer(self, c: int, refused: int = 0) -> bool:
        """A lookup's answer; ``refused`` 1: the code answered 503 for a reason of its
        own (an error), whatever the model would have answered."""
        cl = self.clients[c]
        self.enabled(cl.lk == 2, "lookup: no snapshot")
        if refused:
            self._look_done(cl)
            return False
        # The record read first covered the snapshot: answered with nothing read again
        # (LedgerReader._read); else the record read again must cover it.
        answered = cl.ls == cl.lr or (
            self.nodes[self.rec].tl == self.nodes[cl.lr].tl
            and self.covers(self.rec, cl.ls)
            and not self.lhalted
            and self.rto == 0
            and not self.untrusted
        )
        if answered:
            s = self.nodes[cl.ls]
            self.check((s.app & cl.lmin) == cl.lmin, "a lookup shows less than an earlier one")
            if cl.lthen == T_ASSIGNED:
                self.check(s.live == cl.hand and s.used, "a lookup contradicts an ASSIGNED")
            elif cl.lthen == T_RELEASED:
                self.check(s.live != cl.hand, "a lookup contradicts an answered release")
            self.seen |= s.app
        self._look_done(cl)
        return answered

    def _look_done(self, cl: Client) -> None:
        cl.lk = cl.lr = cl.ls = cl.lmin = cl.lthen = 0

    def retry(self, c: int) -> None:
        cl = self.clients[c]
        self.enabled(cl.idem != 0, "retry: no record to replay")
        self.check(cl.hold == 1 and cl.hand == cl.idem, "a retry got back a key given back")

    # --- the end ----------------------------------------------------------------------

    def settled(self) -> list[str]:
        """What ledger.pml asserts at its timeout (nothing else can happen): what is
        not done, empty when all is."""
        if self.lhalted or self.fhalted:
            return []
        wrong = []
        if self.rto or self.here.pto or self.untrusted:
            wrong.append("a restore or a vouch is still pending")
        wrong += [
            f"client {c} never appended its PUT"
            for c in range(1, self.ncl + 1)
            if self.clients[c].pu
        ]
        for e in range(1, self.ne):
            entry = self.entries[e]
            if entry.st not in (ACKED, LOST):
                wrong.append(f"entry {e} never applied")
            if entry.op != ISSUE and not entry.ans:
                wrong.append(f"entry {e} never answered")
        return wrong

    def describe(self) -> str:
        """The state in a line: for a failure's message."""
        ks = " ".join(f"k{k}={s.ks}/{s.kb}" for k, s in enumerate(self.ks) if k)
        states = " ".join(f"{e}:{x.st}" for e, x in enumerate(self.entries) if e)
        return (
            f"srv={self.srv} rec={self.rec} rto={self.rto} pto={self.here.pto} "
            f"untrusted={int(self.untrusted)} lhalted={int(self.lhalted)} {ks} entries {states}"
        )

    def digest(self) -> list[str]:
        """What ledger.pml prints at the end of a replay (STATE and HERE lines)."""
        h = self.here
        dv = sum(o << (3 * e) for e, o in h.dv.items())
        return [
            f"STATE srv={self.srv} nn={self.nn} ne={self.ne} rec={self.rec} "
            f"rhead={self.rhead} rto={self.rto} curtl={self.curtl} hot={int(self.hot)} "
            f"untrusted={int(self.untrusted)} lhalted={int(self.lhalted)} "
            f"fhalted={int(self.fhalted)}",
            f"HERE live={h.live} used={int(h.used)} hist={h.hist} req={h.req} "
            f"cold={int(h.cold)} lhead={h.lhead} pto={h.pto} app={h.app} dv={dv}",
        ]

    # --- steps by name ----------------------------------------------------------------

    def step(self, action: str, *params: int) -> Any:
        method: Callable[..., Any] = getattr(self, action)
        result = method(*params)
        self.trimok = action == "trim" or (action == "confirm" and bool(result))
        return result

/*
 * keydispenser: the ledger's protocol and the PostgreSQL fence, as a model for SPIN.
 *
 * The model is the code's protocol: every action below names the file and function it
 * stands for, takes the steps that code takes, and is checked against the real code by
 * the simulation (ops/keydispenser_ops/simulation/: the real ledger code under
 * simulated faults, each run's trace replayed here or in its executable mirror,
 * ops/keydispenser_ops/simulation/mirror.py). docs/reliability.md ("The protocol as a
 * model") says what is modelled and the bounds; tests/model/test_ledger_model.py runs
 * it.
 *
 * One key, K, of a type with a ledger and reissue_released; two API clients, A and B.
 * Every action is one atomic step of the real protocol (a Lua script, a PostgreSQL
 * transaction, an HTTP answer, a read), and SPIN explores every interleaving of them.
 *
 * PostgreSQL is a tree of commits ("nodes"): each transaction adds a child of the
 * primary's latest node; a promotion makes an ancestor the primary's latest (the
 * replica had replayed up to it: a suffix of commits is lost). A node holds the state
 * after its commit: K's ledger rows, whether K is in the cold table, the ledger chain's
 * head, a restore pending, the operations the transaction wrote (a ledger node). Redis
 * holds the hot list, the stream of ledger entries and who holds them, the sync record
 * (the newest stamp recorded, the ledger head it carried, a restore pending), the
 * ledger log (one entry per ledger transaction: its id, the head before it, what it
 * wrote) and the published outcomes.
 *
 * Switches (-D):
 *   Worlds, one at a time: W_PAIR, W_REISSUE, W_QUIET, W_TWICE, W_REDIS, W_MIXED,
 *   W_CLAIM, W_LOSS, W_LOOK (each says what it exercises, below).
 *   Variants, each a mechanism of the design taken out or an earlier design put back
 *   (tests/model/test_ledger_model.py says what each must break):
 *   REPLAY_REDECIDES         round 4's restore: the lost batches' entries are decided
 *                            again, in stream order, after the fence settled every
 *                            release (instead of replaying what the log recorded).
 *   REPLAY_AFTER_NEXT_BATCH  round 4's schedule: nothing waits for the restore; it runs
 *                            after the next batch's acknowledgement, trimmed first.
 *   LOG_AFTER_COMMIT         the log entry is written with the acknowledgement.
 *   ANY_TIMELINE             a ledger transaction passes on any timeline that covers
 *                            the record (not only the record's own).
 *   HEAD_ONLY_TARGET         a fence restores up to the record's head only, not the
 *                            restore the record has pending (round 6's fence).
 *   PENDING_FIRST            a fence keeps a restore the server has pending from an
 *                            earlier fence, even when the record has moved past it.
 *   ADOPT_ONLY_WITHOUT_RESTORE  a promoted server's timeline is taken up only when no
 *                            restore is pending (round 6: a restore then never passes).
 *   TRIM_WHEN_REFUSED        a confirmation the record refuses trims the log too (an
 *                            old primary's, after the fence: while the restore waits).
 *   CLEAR_ONLY_ITS_RESTORE   the restore pending is cleared only by the restore's own
 *                            confirmation (not by a later link's: round 7's rule).
 *   STALE_TARGET             a restore walks to the target it began with, pending no
 *                            more (another restored it, or a later fence's since).
 *   LOOKUP_NO_WAIT           a lookup answers its snapshot without waiting for the
 *                            record to cover it.
 *   REPLAY                   replay one trace (trace.pml, written by the simulation's
 *                            cross-check): each step is the action the trace names.
 *                            A trace may split what the search takes as one step, as
 *                            the code does: a vouch's commit and its record
 *                            (A_VOUCH_COMMIT, then A_VOUCH of that node); a read that
 *                            blocked across a fence or a halt; a restore another keysync
 *                            finished first (its target held: a link of nothing); a batch
 *                            kept in memory across the restore its refusal ran; a lookup
 *                            refused by an error of its own; a take's record read and
 *                            its commit (A_TAKE_BEGIN, then A_TAKE judged against the
 *                            record read: a Redis loss or a halt in between commutes
 *                            with a commit that writes PostgreSQL only, so the search's
 *                            take before them reaches the same states). The search
 *                            explores the atomic forms; the replay checks that each
 *                            split step is one the model's rules allow.
 */

#define NONE 0
#define CA 1
#define CB 2

#define ISSUE 1
#define USE 2
#define REL 3

#define UNREAD 1
#define ACKED 9                 /* entry states; held by keysync k: 2 + k; LOST: gone */
#define LOST 10

#define O_ASSIGNED 1            /* outcomes of a status change (shared/domain/outcomes.py) */
#define O_RELEASED 2            /* UNUSED or UNASSIGNED */
#define O_REFUSED 3             /* NOT_ISSUED */
#define O_NOTFOUND 4            /* NOT_FOUND */

#define T_ASSIGNED 1            /* what an answer told a client about its issue */
#define T_RELEASED 2

#define IDLE 0                  /* keysync states */
#define HOLDING 1               /* read a batch (LedgerStream.read) */
#define BEGUN 2                 /* read the record its transaction is judged against */
#define COMMITTED 3             /* committed a ledger transaction, not confirmed */
#define TAKEN 4                 /* committed a take of K, not pushed */
#define TAKE_BEGUN 5            /* a take: read the record it is judged against (REPLAY) */
#define RQ_BEGUN 6              /* a requeue transaction: read the record */
#define RS_BEGUN 7              /* a restore: read the record, took its target */

#define OP_ISSUE 16             /* the operations a ledger node wrote (table.Applied.ops): */
#define OP_USED 32              /* OP_ISSUE + e: issue row of entry e inserted; */
#define OP_REL 48               /* OP_USED: K's row used; OP_REL: K's row released */
#define OP_REQ 64               /* OP_REQ: releases settled; OP_OUT + e: outcome of e */
#define OP_OUT 80
#define MAXOPS 4

#define MAXE 8                  /* stream entries 1..7 */
#define MAXN 18                 /* commit nodes 1..17; node 0: the migrated database */
#define bitof(e) (1 << (e))

#if defined(REPLAY_REDECIDES) || defined(REPLAY_AFTER_NEXT_BATCH) || defined(LOG_AFTER_COMMIT)
#define VARIANT 1
#endif

/* ---- worlds: how many of each action the clients and the faults may take ---- */
#define LOOKUPS 0
#define CLAIMS 0
#define RLOSS_KINDS 1           /* 1: a failover to a lagging replica; 3: also restarts */
#define RLOSS_MASK 31           /* the newest writes a Redis loss may take (A_RLOSS) */
#if defined(W_PAIR)             /* two keysyncs, a PUT pair, a repeat, a promotion */
#define NKS 2
#define POPS 1
#define PUTS 0
#define PAIRS 1
#define REPEATS 1
#define PROMOTIONS 1
#define CRASHES 0
#define REQUEUES 0
#define TRIMS 0
#define CLIENTS 1
#define RLOSSES 0
#define RETRIES 0
#elif defined(W_REISSUE)        /* three pops over two clients, requeues, a promotion */
#define NKS 1
#define POPS 3
#define PUTS 2
#define PAIRS 0
#define REPEATS 0
#define PROMOTIONS 1
#define CRASHES 0
#define REQUEUES 2
#define TRIMS 0
#define CLIENTS 2
#define RLOSSES 0
#define RETRIES 0
#elif defined(W_QUIET)          /* a PUT, a repeat, trims, a promotion */
#define NKS 1
#define POPS 1
#define PUTS 1
#define PAIRS 0
#define REPEATS 1
#define PROMOTIONS 1
#define CRASHES 0
#define REQUEUES 0
#define TRIMS 2
#define CLIENTS 1
#define RLOSSES 0
#define RETRIES 0
#elif defined(W_MIXED)          /* two keysyncs, two clients, a requeue, a trim */
#define NKS 2
#define POPS 2
#define PUTS 2
#define PAIRS 0
#define REPEATS 0
#ifdef SECOND_PROMOTION          /* a variant's search: a restore promoted away */
#define PROMOTIONS 2
#else
#define PROMOTIONS 1
#endif
#define CRASHES 0
#define REQUEUES 1
#define TRIMS 1
#define CLIENTS 2
#define RLOSSES 0
#define RETRIES 0
#elif defined(W_TWICE)          /* two promotions, a keysync crash, a repeat */
#undef LOOKUPS
#define LOOKUPS 1
#define NKS 1
#define POPS 1
#define PUTS 1
#define PAIRS 0
#define REPEATS 1
#define PROMOTIONS 2
#define CRASHES 1
#define REQUEUES 0
#define TRIMS 0
#define CLIENTS 1
#define RLOSSES 0
#define RETRIES 0
#elif defined(W_REDIS)          /* a Redis failover, an Idempotency-Key retry, a promotion */
#define NKS 1
#define POPS 2
#define PUTS 2
#define PAIRS 0
#define REPEATS 0
#define PROMOTIONS 1
#define CRASHES 0
#define REQUEUES 1
#define TRIMS 0
#define CLIENTS 2
#define RLOSSES 1
#define RETRIES 1
#undef RLOSS_MASK
#define RLOSS_MASK 25           /* an entry, a log entry, the pending restore */
#elif defined(W_CLAIM)          /* a live keysync's batch claimed by another */
#undef CLAIMS
#define CLAIMS 1
#define NKS 2
#define POPS 1
#define PUTS 1
#define PAIRS 0
#define REPEATS 1
#define PROMOTIONS 1
#define CRASHES 0
#define REQUEUES 0
#define TRIMS 0
#define CLIENTS 1
#define RLOSSES 0
#define RETRIES 0
#elif defined(W_LOSS)           /* Redis restarted empty or from an old snapshot, trims */
#undef RLOSS_KINDS
#define RLOSS_KINDS 3
#undef LOOKUPS
#define LOOKUPS 1
#define NKS 1
#define POPS 1
#define PUTS 1
#define PAIRS 0
#define REPEATS 1
#define PROMOTIONS 1
#define CRASHES 0
#define REQUEUES 0
#define TRIMS 1
#define CLIENTS 1
#define RLOSSES 1
#define RETRIES 0
#elif defined(W_LOOK)           /* lookups beside a PUT, a promotion, a trim */
#undef LOOKUPS
#define LOOKUPS 2
#define NKS 1
#define POPS 1
#define PUTS 1
#define PAIRS 0
#define REPEATS 0
#define PROMOTIONS 1
#define CRASHES 0
#define REQUEUES 0
#define TRIMS 1
#define CLIENTS 1
#define RLOSSES 0
#define RETRIES 0
#elif defined(W_REPLAY)         /* replaying a trace (REPLAY): every budget generous */
#undef LOOKUPS
#define LOOKUPS 250
#undef CLAIMS
#define CLAIMS 250
#undef RLOSS_KINDS
#define RLOSS_KINDS 3
#define NKS 2
#define POPS 250
#define PUTS 250
#define PAIRS 250
#define REPEATS 250
#define PROMOTIONS 250
#define CRASHES 250
#define REQUEUES 250
#define TRIMS 250
#define CLIENTS 2
#define RLOSSES 250
#define RETRIES 250
#else
#error "choose a world: -DW_PAIR, -DW_REISSUE, -DW_QUIET, -DW_TWICE, -DW_REDIS, -DW_MIXED, -DW_CLAIM, -DW_LOSS or -DW_LOOK"
#endif

/* ---- the stream of ledger entries (Redis) ---- */
byte eop[MAXE];                 /* ISSUE (a pop), USE (PUT ASSIGNED), REL (PUT UNASSIGNED) */
byte ecli[MAXE];                /* the client */
byte eiss[MAXE];                /* a PUT's: the issue (entry) it is about */
byte est[MAXE];                 /* UNREAD, held by keysync k (2 + k), ACKED, LOST */
bit eans[MAXE];                 /* a PUT answered (or given up: 503) */
byte outc[MAXE];                /* its outcome, published by the confirmation */
byte ne = 1;

/* ---- PostgreSQL: the commit tree ---- */
byte par[MAXN];                 /* parent node */
byte tl[MAXN];                  /* the timeline it was committed on */
byte live[MAXN];                /* K's live issue row: the entry that issued it (0: none) */
bit used[MAXN];                 /* the live row is ASSIGNED */
byte hist[MAXN];                /* issues given back (rows moved to kd_released_issues) */
byte req[MAXN];                 /* of those, requeued (or settled: never requeued) */
bit cold[MAXN];                 /* K is in the cold table */
byte lhead[MAXN];               /* the ledger chain's head on this branch (a node) */
byte lprev[MAXN];               /* a ledger node: the head before it */
int held[MAXN];                 /* the links this branch holds (kd_chain_links): its own
                                 * ledger nodes and those a restore wrote again */
byte rest[MAXN];                /* a restore node: the head it restored up to */
byte pto[MAXN];               /* a restore pending on this branch (kd_sync_clock.ledger_restore) */
byte ents[MAXN];                /* a ledger node: the entries it applied (its log's too) */
byte app[MAXN];                 /* every entry applied on this branch (what a read shows) */
byte ops[MAXN * MAXOPS];        /* a ledger node: what it wrote, in order */
byte nops[MAXN];
int rlinks[MAXN];               /* a restore node: the links whose writes it wrote again
                                 * (its log entry holds their operations, in order) */
bit inlog[MAXN];                /* its log entry is in Redis */
byte gone[MAXN];                /* why it left the log: 1 trimmed, 2 trimmed while a
                                 * restore was pending, 3 lost with Redis state */
bit isfence[MAXN];              /* a fence's commit: a new history starts there */
int dv[MAXN];                   /* the decision rows on this branch (kd_outcomes): entry
                                 * e's outcome in bits 3e..3e+2 (DV, SETDV) */
#define DV(n, e) ((dv[n] >> (3 * (e))) & 7)
#define SETDV(n, e, o) dv[n] = (dv[n] & ~(7 << (3 * (e)))) | ((o) << (3 * (e)))
byte nn = 1;                    /* next node */
byte srv = 0;                   /* the primary's latest commit */
byte curtl = 1;                 /* the primary's timeline */

/* ---- Redis: the sync record, the hot list, Idempotency-Key records ---- */
byte rec = 0;                   /* the newest stamp recorded (a node) */
byte rhead = 0;                 /* the ledger head that stamp carried */
byte rto = 0;                 /* a restore pending: the head to restore (the claim) */
bit trimok = 0;               /* the step before was an accepted confirmation (or its trim):
                                 ledger_confirm.lua trims in the confirmation's own script */
bit trimnext = 0;             /* set by the confirmation being taken (always 0 between steps) */
bit fhalted = 0;                /* the fence halted: both tiers lost state */
bit lhalted = 0;                /* the ledger failed closed */
bit hot = 0;                    /* K is in the hot list */
bit twice = 0;                  /* the duplicate alarm fired */
bit rsref = 0;                  /* a restore was refused, nothing changed since (search) */
bit untrusted = 0;              /* Redis lost state: the record must be rebuilt (vouch) */
bit rflost = 0;                 /* a Redis loss took a pending restore with it */
bit inloss = 0;                 /* replaying a Redis loss piece by piece */
byte idem[3];                   /* a client's Idempotency-Key record: the issue it replays */

/* ---- keysyncs (keysync/ledger.py LedgerDrain, keysync/main.py Keysync) ---- */
/* Slots 1..NKS; a replayed trace may name slot 3 too: a keysync's refill, which runs
 * beside its ledger drain (keysync/main.py run), as a slot of its own. */
byte ks[4];                     /* IDLE, HOLDING, BEGUN, COMMITTED, TAKEN, RQ_BEGUN */
byte kb[4];                     /* the entries of its batch (a bitmask) */
byte krec[4];                   /* the record its transaction is judged against */
byte knode[4];                  /* the node it committed */
byte ktarget[4];                /* a restore's target */
#ifdef REPLAY
bit isvouch[MAXN];              /* a node VOUCH committed (its record may follow) */
byte kkeep[4];                  /* a batch kept in memory across a restore its turn ran */
#endif
bit isadopt[MAXN];              /* an adoption's commit (VOUCH: no ledger change); its
                                 * claim of the record comes first (postgres_fence._adopt),
                                 * so a lookup's snapshot may be taken between the two */
byte kso[MAXE];                 /* outcomes decided by the batch, until confirmed */
#ifdef REPLAY_AFTER_NEXT_BATCH
bit old[MAXN];                  /* log entries older than the retention */
#endif

/* ---- clients ---- */
byte hand[3];                   /* the issue of K the client was given last (0: none) */
byte hold[3];                   /* 1: it holds K; 2: it sent K back, not answered yet;
                                 * 3: it gave up waiting for that answer (unknown) */
bit moved[3];                   /* K went to another client while its release waited */
byte truth[MAXE];               /* per issue: what an answer said (T_ASSIGNED, T_RELEASED) */
byte pu[3];                     /* a PUT begun: the op; pw: the newest entry it waits for */
byte pw[3];
byte lk[3];                     /* a lookup: 1 read the record, 2 took its snapshot */
byte lr[3];                     /* the record it read (its history: tl[lr]), its snapshot */
byte ls[3];
byte lmin[3];                   /* what every lookup answered before it began showed */
byte lthen[3];                  /* what its client had been answered when it began */
byte seen = 0;                  /* every entry a lookup's answer showed applied */
byte lastans[3];                /* the client's last answered PUT (a repeat asks it again) */

/* ---- derived from the state above after every action (derive()), for the guards:
 *      they tell no two states apart ---- */
byte frontier = 0;              /* every entry up to it is applied or gone */
byte answerable = 0;            /* PUT entries whose outcome is published, not answered */
byte stranded = 0;              /* PUT entries never to be answered (entry or outcome lost) */
bit unread = 0;                 /* an entry nobody holds */
bit behind = 0;                 /* the primary's history does not cover the record */
bit anylog = 0;                 /* the log holds a link */

/* ---- budgets ---- */
byte b_pop = POPS;
byte b_put = PUTS;
byte b_pair = PAIRS;
byte b_rep = REPEATS;
byte b_prom = PROMOTIONS;
byte b_crash = CRASHES;
byte b_req = REQUEUES;
byte b_trim = TRIMS;
byte b_rloss = RLOSSES;
byte b_retry = RETRIES;
byte b_look = LOOKUPS;
byte b_claim = CLAIMS;

/* scratch: each action sets what it reads, and clears it all when done (CLEAN), so
 * that it never tells two states apart */
byte t, u, o, i, j, k, c, m, w, q, e, n, x;
int lostset;
bit r, ok;
#define CLEAN trimok = 0; derive(); t = 0; u = 0; o = 0; i = 0; j = 0; k = 0; c = 0; m = 0; w = 0; q = 0; e = 0; n = 0; x = 0; lostset = 0; r = 0; ok = 0

/* ---- replaying a trace (REPLAY): each step must be the action the trace names ----
 * WHEN(code, cond): the action's guard. Searching, the action is enabled exactly when
 * it changes something (so that SPIN's timeout means nothing else can happen);
 * replaying, it is taken when the trace names it, and its condition is asserted.
 * PICK_C(P)/PICK_K(P): a client or keysync for which P holds (the trace's, replaying). */
#ifdef REPLAY
#include "trace.pml"            /* NSTEPS; init_trace() fills tcode[], tp1[], tp2[] */
short step = 0;
#define WHEN(code, cond) step < NSTEPS && tcode[step] == code -> assert(cond)
#define PARAM1(v) v = tp1[step]
#define PARAM2(v) v = tp2[step]
#define PARAM3(v) v = tp3[step]
#define PARAM4(v) v = tp4[step]
#define STEPPED step++; printf("STEP %d\n", step)
#define PICK_C(P) c = tp1[step]; assert(c >= 1 && c <= CLIENTS && P(c))
#define PICK_K(P) k = tp1[step]; assert(k >= 1 && k <= 3 && P(k))
#else
#define WHEN(code, cond) (cond)
#define PARAM1(v) skip
#define PARAM2(v) skip
#define STEPPED skip
#define PICK_C(P) if :: P(CA) -> c = CA :: CLIENTS > 1 && P(CB) -> c = CB fi
#define PICK_K(P) if :: P(1) -> k = 1 :: NKS > 1 && P(2) -> k = 2 fi
#endif
#define ANY_C(P) (P(CA) || (CLIENTS > 1 && P(CB)))
#ifdef REPLAY
#define ANY_K(P) (P(1) || P(2) || P(3))
#else
#define ANY_K(P) (P(1) || (NKS > 1 && P(2)))
#endif

/* action codes (the simulation's trace names them: simulation/trace.py) */
#define A_POP 1
#define A_PUT_BEGIN 2
#define A_PAIR 3
#define A_REPEAT 4
#define A_PUT_APPEND 5
#define A_ANSWER 6
#define A_GIVE_UP 7
#define A_READ 8
#define A_CLAIM 9
#define A_BEGIN 10
#define A_COMMIT 11
#define A_CONFIRM 12
#define A_CRASH 13
#define A_TAKE 14
#define A_PUSH 15
#define A_RQ_BEGIN 16
#define A_RQ_COMMIT 17
#define A_ADOPT 18
#define A_FENCE 20
#define A_RESTORE 21
#define A_TRIM 22
#define A_RETRY 23
#define A_RLOSS 24
#define A_VOUCH 25
#define A_PROMOTE 26
#define A_LOOK_RECORD 27
#define A_LOOK_SNAPSHOT 28
#define A_LOOK_ANSWER 29
#define A_ABANDON 30
#define A_LOSS_ENTRY 31
#define A_LOSS_OUTCOME 32
#define A_LOSS_LINK 33
#define A_LOSS_RESTORE 34
#define A_LOSS_END 35
#define A_DROP 36
#define A_RS_BEGIN 37
#define A_VOUCH_COMMIT 38
#define A_TAKE_BEGIN 39
#define A_PUT_CAUGHT 40

/* ---------------------------------------------------------------------------------- */

inline newnode() {
  par[nn] = srv; tl[nn] = curtl; live[nn] = live[srv]; used[nn] = used[srv];
  hist[nn] = hist[srv]; req[nn] = req[srv]; cold[nn] = cold[srv]; lhead[nn] = lhead[srv];
  pto[nn] = pto[srv]; app[nn] = app[srv]; held[nn] = held[srv]; dv[nn] = dv[srv];
  srv = nn; nn++
}

/* r = 1 when node a is node b or one of its ancestors (b's history covers a) */
inline covers(b, a) {
  t = b; r = 0;
  do
  :: t == a -> r = 1; break
  :: t != a && t == 0 -> break
  :: t != a && t != 0 -> t = par[t]
  od
}

/* The derived variables (declared above), from the state. */
inline derive() {
  frontier = 0; answerable = 0; stranded = 0; unread = 0; anylog = 0;
  t = 1;
  do
  :: t < ne && (est[t] == ACKED || est[t] == LOST) && frontier == t - 1 -> frontier = t; t++
  :: t < ne && !((est[t] == ACKED || est[t] == LOST) && frontier == t - 1) -> t++
  :: t >= ne -> break
  od;
  t = 1;
  do
  :: t < ne ->
     if :: est[t] == UNREAD -> unread = 1 :: else -> skip fi;
     if
     :: eop[t] != ISSUE && !eans[t] && outc[t] != 0 -> answerable = answerable | bitof(t)
     :: eop[t] != ISSUE && !eans[t] && outc[t] == 0 && (est[t] == LOST || est[t] == ACKED) ->
        stranded = stranded | bitof(t)
     :: else -> skip
     fi;
     t++
  :: t >= ne -> break
  od;
  t = 1;
  do
  :: t < MAXN -> if :: inlog[t] -> anylog = 1; break :: else -> t++ fi
  :: t >= MAXN -> break
  od;
  covers(srv, rec); behind = !r
}

/* The guard (shared/stores/fence/sql.py GUARD, GUARD_LEDGER): a guarded write runs only
 * on a primary whose history covers the record it was judged against, and a ledger
 * transaction only on that record's own timeline (flag 4; ANY_TIMELINE: on any) and
 * with no restore pending on the server (but for the restore itself). */
#define GUARD_PASSES (!fhalted && !untrusted)
#ifdef ANY_TIMELINE
#define ON_TIMELINE(x) true
#else
#define ON_TIMELINE(x) (curtl == tl[x])
#endif
#ifdef REPLAY_AFTER_NEXT_BATCH
#define NO_RESTORE_HERE true
#else
#define NO_RESTORE_HERE (pto[srv] == 0)
#endif

/* A ledger node on the primary's latest node: chained (GUARD_LEDGER moves the lane's
 * head), logged before it commits (LedgerStream.add_link in LedgerDrain._once). */
inline ledger_node() {
  newnode();
  lprev[srv] = lhead[srv]; lhead[srv] = srv; ents[srv] = 0; nops[srv] = 0;
  held[srv] = held[srv] | (1 << srv);
#ifndef LOG_AFTER_COMMIT
  inlog[srv] = 1;
#endif
}

inline wrote(op) {
  assert(nops[srv] < MAXOPS);
  ops[srv * MAXOPS + nops[srv]] = op; nops[srv]++
}

/* Record a stamp (lua/sync_record.lua record_stamp): a newer commit of the record's
 * history moves it; an older one of the same history and timeline (no fence or
 * adoption since) leaves it, and is fine; any other is stale (its commit may be lost,
 * or is from before a fence, or from an older timeline: a straggler, even when its
 * commit survived the promotion). */
inline record(n, ok) {
  covers(n, rec);
  if
  :: r -> rec = n; rhead = lhead[n]; ok = 1; rsref = 0
  :: else ->
     t = rec; ok = 0;
     do
     :: t == n -> ok = (tl[n] == tl[rec]); break   /* an older timeline's: 'stale' */
     :: t != n && (t == 0 || isfence[t]) -> break
     :: t != n && t != 0 && !isfence[t] -> t = par[t]
     od
  fi
}

/* r = 1 when the primary holds ledger link x (ledger_sql.HOLDS_LINK), or x is empty */
inline onchain(x) {
  r = (x == 0 || (held[srv] & (1 << x)) != 0)
}

/* ---- deciding a batch (shared/stores/ledger/decide.py apply) ---------------------- */

/* An issue entry (table._issue, INSERT_LEDGER_ISSUED, SELECT_ISSUED_TWICE): inserted
 * unless this issue was given back since (an entry applied again, wherever its row
 * went) or K's row is taken (by this entry: applied again; by another: issued twice,
 * the alarm). */
inline decide_issue(e) {
  if
  :: live[srv] == e -> skip
  :: (hist[srv] & bitof(e)) != 0 -> skip
  :: live[srv] == 0 && (hist[srv] & bitof(e)) == 0 -> live[srv] = e; used[srv] = 0; wrote(OP_ISSUE + e)
  :: live[srv] != 0 && live[srv] != e && (hist[srv] & bitof(e)) == 0 ->
     twice = 1
#ifndef VARIANT
     ; assert(false)
#endif
  fi
}

/* A mark (table._marks: UPDATE_LEDGER_USED, RELEASE_TO_HISTORY): applied to K's live
 * row when it is this client's, neither used nor released, and older than the mark. */
inline apply_mark(e) {
  if
  :: live[srv] != 0 && ecli[live[srv]] == ecli[e] && !used[srv] && live[srv] < e ->
     if
     :: eop[e] == USE -> used[srv] = 1; wrote(OP_USED)
     :: eop[e] == REL -> hist[srv] = hist[srv] | bitof(live[srv]); live[srv] = 0; wrote(OP_REL)
     fi
  :: else -> skip
  fi
}

/* The outcome of a status change from K's state once the batch is applied
 * (table._decide, table.key_status, shared/domain/outcomes.py outcome_of). */
inline outcome_now(e) {
  if
  :: live[srv] != 0 && ecli[live[srv]] == ecli[e] ->
     if
     :: eop[e] == USE && used[srv] -> o = O_ASSIGNED
     :: else -> o = O_REFUSED
     fi
  :: live[srv] != 0 && ecli[live[srv]] != ecli[e] -> o = O_NOTFOUND
  :: live[srv] == 0 ->
     u = 0; t = 1;                                    /* SELECT_RELEASED_ISSUE: the latest */
     do
     :: t < MAXE -> if :: (hist[srv] & bitof(t)) != 0 -> u = t :: else -> skip fi; t++
     :: t >= MAXE -> break
     od;
     if
     :: u != 0 && ecli[u] == ecli[e] && eop[e] == REL -> o = O_RELEASED
     :: u != 0 && ecli[u] == ecli[e] && eop[e] == USE -> o = O_REFUSED
     :: else -> o = O_NOTFOUND
     fi
  fi
}

/* Decide keysync k's batch on the primary's latest node: issues first, then the marks
 * not decided before (kd_outcomes), in stream order, then each status change's outcome
 * (the one decided before, or from K's state now), written beside it. */
inline decide_batch(k) {
  e = 1;
  do
  :: e < ne -> if :: (kb[k] & bitof(e)) != 0 && eop[e] == ISSUE -> decide_issue(e) :: else -> skip fi; e++
  :: e >= ne -> break
  od;
  e = 1;
  do
  :: e < ne -> if :: (kb[k] & bitof(e)) != 0 && eop[e] != ISSUE && DV(srv, e) == 0 -> apply_mark(e) :: else -> skip fi; e++
  :: e >= ne -> break
  od;
  e = 1;
  do
  :: e < ne ->
     if
     :: (kb[k] & bitof(e)) != 0 && eop[e] != ISSUE && DV(srv, e) != 0 -> kso[e] = DV(srv, e)
     :: (kb[k] & bitof(e)) != 0 && eop[e] != ISSUE && DV(srv, e) == 0 ->
        outcome_now(e); kso[e] = o; SETDV(srv, e, o); wrote(OP_OUT + e)
     :: else -> skip
     fi;
     e++
  :: e >= ne -> break
  od;
  ents[srv] = kb[k]; app[srv] = app[srv] | kb[k]
}

/* What an answer says of issue i must agree with what earlier answers said; "not found"
 * only when the issue's own entry was lost with Redis state (async durability: stated,
 * docs/reliability.md). */
inline answered(i, o) {
  if
  :: o == O_ASSIGNED -> assert(truth[i] != T_RELEASED); truth[i] = T_ASSIGNED
  :: o == O_RELEASED -> assert(truth[i] != T_ASSIGNED); truth[i] = T_RELEASED
  :: o == O_REFUSED && eop[e] == USE -> assert(truth[i] != T_ASSIGNED); truth[i] = T_RELEASED
  :: o == O_REFUSED && eop[e] == REL -> assert(truth[i] != T_RELEASED); truth[i] = T_ASSIGNED
  :: o == O_NOTFOUND -> assert(est[i] == LOST)    /* the client was given K under issue i */
  fi
}

/* The newest entry still in the stream (LedgerStream.newest_entry): 0 when none. */
inline newest() {
  x = 0; t = 1;
  do
  :: t < ne -> if :: est[t] != ACKED && est[t] != LOST -> x = t :: else -> skip fi; t++
  :: t >= ne -> break
  od
}

#define REQUEUE_DUE ((hist[srv] & ~req[srv]) != 0)
#ifdef ADOPT_ONLY_WITHOUT_RESTORE
#define ADOPT_PATH (rto == 0 && pto[srv] == 0)
#else
#define ADOPT_PATH true
#endif

/* ---- the restore (keysync/ledger.py LedgerDrain.restore, _chain) ----------------- */

/* Walk the log from the target back to a link the primary holds (LedgerDrain._chain);
 * r = 1 when every link on the way is in the log (the restore can be exact), reaching
 * the lane's start only on a server with no link of its own; m: where it stopped. */
inline chain_intact(x) {
  m = x;
  do
  :: true ->
     onchain(m);
     if
     :: m == 0 -> r = (lhead[srv] == 0); break
     :: m != 0 && r -> break
     :: m != 0 && !r && !inlog[m] -> break
     :: m != 0 && !r && inlog[m] -> m = lprev[m]
     fi
  od
}

/* Write again what one lost link wrote, its operations in order (replay.apply_ops:
 * FORCE_ISSUED, FORCE_USED, FORCE_RELEASED_TO_HISTORY, FORCE_REQUEUED,
 * FORCE_OUTCOMES): nothing is decided. */
inline replay_link(q) {
  j = 0;
  do
  :: j < nops[q] ->
     x = ops[q * MAXOPS + j];
     if
     :: x >= OP_ISSUE && x < OP_USED -> if :: live[srv] == 0 -> live[srv] = x - OP_ISSUE; used[srv] = 0 :: else -> skip fi
     :: x == OP_USED -> if :: live[srv] != 0 -> used[srv] = 1 :: else -> skip fi
     :: x == OP_REL -> if :: live[srv] != 0 -> hist[srv] = hist[srv] | bitof(live[srv]); live[srv] = 0 :: else -> skip fi
     :: x == OP_REQ -> req[srv] = req[srv] | hist[q]
     :: x >= OP_OUT -> SETDV(srv, x - OP_OUT, DV(q, x - OP_OUT))
     fi;
     j++
  :: j >= nops[q] -> break
  od;
  ents[srv] = ents[srv] | ents[q]; app[srv] = app[srv] | ents[q]
}

/* The lost links from the one after the first the primary holds up to x, oldest first
 * (the log is walked newest first; a chain's links are numbered in commit order); a
 * lost restore stands for the links it wrote again (its log entry holds their writes).
 * The restore's link holds the links walked from now on (INSERT_LINKS). */
inline restore_ops(x) {
  lostset = 0; q = x;
  do
  :: true ->
     onchain(q);
     if :: r -> break :: else -> lostset = lostset | (1 << q); q = lprev[q] fi
  od;
  held[srv] = held[srv] | lostset;
  i = 1;
  do
  :: i < nn -> if :: (lostset & (1 << i)) != 0 && rlinks[i] != 0 -> lostset = (lostset & ~(1 << i)) | rlinks[i] :: else -> skip fi; i++
  :: i >= nn -> break
  od;
  rlinks[srv] = lostset;
  i = 1;
  do
  :: i < nn -> if :: (lostset & (1 << i)) != 0 -> replay_link(i) :: else -> skip fi; i++
  :: i >= nn -> break
  od
}

#ifdef REPLAY_REDECIDES
/* round 4: every entry the lost batches applied, decided again: issues first, then
 * the rest, each in stream order */
inline redecide(x) {
  m = 0; q = x;
  do
  :: true ->
     onchain(q);
     if :: r -> break :: else -> m = m | ents[q]; held[srv] = held[srv] | (1 << q); q = lprev[q] fi
  od;
  i = 1;
  do
  :: i < MAXE -> if :: (m & bitof(i)) != 0 && eop[i] == ISSUE -> decide_issue(i) :: else -> skip fi; i++
  :: i >= MAXE -> break
  od;
  i = 1;
  do
  :: i < MAXE ->
     if
     :: (m & bitof(i)) != 0 && eop[i] != ISSUE && DV(srv, i) == 0 -> apply_mark(i); outcome_now(i); SETDV(srv, i, o)
     :: else -> skip
     fi;
     i++
  :: i >= MAXE -> break
  od;
  ents[srv] = m; app[srv] = app[srv] | m
}
#endif

/* The answer a lookup gives from node s, checked: it shows at least what every
 * lookup answered before it began (never changed without a later write), and what its
 * client had been answered before it began (an ASSIGNED holds; a release holds). */
inline look_answer(c, s) {
  assert((app[s] & lmin[c]) == lmin[c]);
  if
  :: lthen[c] == T_ASSIGNED -> assert(live[s] == hand[c] && used[s])
  :: lthen[c] == T_RELEASED -> assert(live[s] != hand[c])
  :: else -> skip
  fi;
  seen = seen | app[s]
}

/* ---- the enabling condition of each action, per client c or keysync k ---- */
#define CAN_PUT(c) (hold[c] == 1 && pu[c] == 0)
#define CAN_REPEAT(c) (c == CA && hold[c] == 1 && pu[c] == 0 && lastans[c] != 0 && eiss[lastans[c]] == hand[c])
#define CAN_CATCH_UP(c) (pu[c] != 0 && pw[c] != 0 && pw[c] <= frontier)
#define CAN_APPEND(c) (pu[c] != 0 && pw[c] == 0)
#define HAS_PUT(c) (pu[c] != 0)
#ifdef REPLAY
#define GIVE_UP_ANY true
#else
#define GIVE_UP_ANY false
#endif
#define CAN_RETRY(c) (idem[c] != 0)
#define CAN_LOOK(c) (lk[c] == 0 && !lhalted && rto == 0 && !untrusted)
#define IN_LOOK1(c) (lk[c] == 1)
#define IN_LOOK2(c) (lk[c] == 2)
#define CAN_READ(k) (ks[k] == IDLE && (unread || (est[1] == 2 + k) || (est[2] == 2 + k) || (est[3] == 2 + k) || (est[4] == 2 + k) || (est[5] == 2 + k) || (est[6] == 2 + k) || (est[7] == 2 + k)))
#define OWNS(k) ((est[1] == 2 + k) || (est[2] == 2 + k) || (est[3] == 2 + k) || (est[4] == 2 + k) || (est[5] == 2 + k) || (est[6] == 2 + k) || (est[7] == 2 + k))
#define CAN_BE_CLAIMED(k) (((ks[k] >= HOLDING && ks[k] <= COMMITTED && kb[k] != 0) || (kb[k] == 0 && OWNS(k))) && ks[3 - k] == IDLE)
#define IS(S, k) (ks[k] == S)
#ifdef REPLAY
#define HOLDING_K(k) (IS(HOLDING, k) || IS(BEGUN, k))
#define RQ_FREE(k) (IS(IDLE, k) || IS(RQ_BEGUN, k))
#define RS_FREE(k) (IS(IDLE, k) || IS(RS_BEGUN, k))
#define TAKE_FREE(k) (IS(IDLE, k) || IS(TAKE_BEGUN, k))
#define TAKE_K(k) IS(TAKE_BEGUN, k)
#else
#define HOLDING_K(k) IS(HOLDING, k)
#define RQ_FREE(k) IS(IDLE, k)
#define RS_FREE(k) IS(IDLE, k)
#endif
#define BEGUN_K(k) IS(BEGUN, k)
#define COMMITTED_K(k) IS(COMMITTED, k)
#define TAKEN_K(k) IS(TAKEN, k)
#define IDLE_K(k) IS(IDLE, k)
#define BUSY_NOW(k) (ks[k] != IDLE)
#define RQ_K(k) IS(RQ_BEGUN, k)
#define RS_K(k) IS(RS_BEGUN, k)
#define BUSY_K(k) (ks[k] != IDLE || OWNS(k))

/* ---------------------------------------------------------------------------------- */

active proctype protocol() {
#ifdef REPLAY
  init_trace();
#endif
  cold[0] = 1; tl[0] = 1;
  do
  /* ---- a dispenser pops K for client c (shared/stores/hot/lua/pop.lua with
   *      ledger.lua: the pop and its issue entry, one script) ---- */
  :: atomic { WHEN(A_POP, b_pop > 0 && hot && ne < MAXE) ->
#ifdef REPLAY
       PARAM1(c); assert(c >= 1 && c <= CLIENTS);
#else
       if :: c = CA :: CLIENTS > 1 -> c = CB fi;
#endif
       b_pop--;
       u = 1;
       do
       :: u <= CLIENTS ->
          assert(hold[u] != 1);                     /* K in one hand at most */
          if :: hold[u] == 2 -> moved[u] = 1 :: else -> skip fi;
          u++
       :: u > CLIENTS -> break
       od;
       hot = 0;
       eop[ne] = ISSUE; ecli[ne] = c; est[ne] = UNREAD;
       hand[c] = ne; hold[c] = 1; moved[c] = 0; idem[c] = ne; lastans[c] = 0;
       printf("pop: client %d gets K, issue entry %d\n", c, ne);
       ne++;
       STEPPED; CLEAN }

  /* ---- a PUT begins (dispenser/mosip.py _change): its op, and the newest entry in
   *      the stream, which it waits for (newest_entry, _caught_up) ---- */
  :: atomic { WHEN(A_PUT_BEGIN, b_put > 0 && ANY_C(CAN_PUT)) ->
       PICK_C(CAN_PUT);
       b_put--;
#ifdef REPLAY
       PARAM2(x); assert(x == USE || x == REL); pu[c] = x;
#else
       if :: pu[c] = USE :: pu[c] = REL fi;
#endif
       newest(); pw[c] = x;   /* 0: nothing to wait for */
       printf("put: client %d begins op %d, waits for entry %d\n", c, pu[c], x);
       STEPPED; CLEAN }

  /* ---- a client asks again what it was answered (the same status, same issue) ---- */
  :: atomic { WHEN(A_REPEAT, b_rep > 0 && CAN_REPEAT(CA)) ->
       b_rep--; e = lastans[CA]; pu[CA] = eop[e]; newest(); pw[CA] = x;
       printf("repeat: entry %d again\n", e);
       STEPPED; CLEAN }

  /* ---- a PUT's wait ends: every entry up to the one it saw is applied (_caught_up:
   *      LedgerStream.applied finds none of them left in the stream); it waits for
   *      nothing more (pw 0), whatever happens before its append ---- */
  :: atomic { WHEN(A_PUT_CAUGHT, ANY_C(CAN_CATCH_UP)) ->
       PICK_C(CAN_CATCH_UP);
       pw[c] = 0;
       printf("caught up: client %d\n", c);
       STEPPED; CLEAN }

  /* ---- then it appends its change (record_used, record_released: the release
   *      forgets the Idempotency-Key record); a Redis lost in between may have brought
   *      back an entry it waited for ---- */
  :: atomic { WHEN(A_PUT_APPEND, ne < MAXE && ANY_C(CAN_APPEND)) ->
       PICK_C(CAN_APPEND);
       eop[ne] = pu[c]; ecli[ne] = c; eiss[ne] = hand[c]; est[ne] = UNREAD;
       if :: pu[c] == REL -> hold[c] = 2; idem[c] = 0 :: else -> skip fi;
       printf("append: client %d entry %d op %d\n", c, ne, eop[ne]);
       pu[c] = 0; pw[c] = 0; ne++;
       STEPPED; CLEAN }

  /* ---- both at once (W_PAIR: sent together: both waited, then both appended) ---- */
  :: atomic { WHEN(A_PAIR, b_pair > 0 && ne + 1 < MAXE && CAN_PUT(CA) && frontier == ne - 1) ->
       b_pair--;
       hold[CA] = 2; idem[CA] = 0;
#ifdef REPLAY
       PARAM1(t);
       if :: t == 0 -> eop[ne] = USE; eop[ne + 1] = REL :: else -> eop[ne] = REL; eop[ne + 1] = USE fi;
#else
       if :: eop[ne] = USE; eop[ne + 1] = REL :: eop[ne] = REL; eop[ne + 1] = USE fi;
#endif
       ecli[ne] = CA; eiss[ne] = hand[CA]; est[ne] = UNREAD;
       ecli[ne + 1] = CA; eiss[ne + 1] = hand[CA]; est[ne + 1] = UNREAD;
       printf("pair: entries %d op %d, %d op %d\n", ne, eop[ne], ne + 1, eop[ne + 1]);
       ne = ne + 2;
       STEPPED; CLEAN }

  /* ---- a PUT is answered with its published outcome (mosip._outcome) ---- */
  :: atomic { WHEN(A_ANSWER, answerable != 0) ->
#ifdef REPLAY
       PARAM1(e); assert(e > 0 && e < ne && (answerable & bitof(e)) != 0);
#else
       e = 1;
       do
       :: e < ne && (answerable & bitof(e)) == 0 -> e++
       :: e < ne && (answerable & bitof(e)) != 0 -> break
       :: e < ne && (answerable & bitof(e)) != 0 && (answerable >> (e + 1)) != 0 -> e++
       od;
#endif
       eans[e] = 1; c = ecli[e];
       printf("answer: entry %d outcome %d (1 assigned 2 released 3 refused 4 notfound)\n", e, outc[e]);
       answered(eiss[e], outc[e]);
       if :: eiss[e] == hand[c] -> lastans[c] = e :: else -> skip fi;
       if
       :: eop[e] == REL && hold[c] >= 2 && eiss[e] == hand[c] && outc[e] == O_RELEASED -> hold[c] = 0
       :: eop[e] == REL && hold[c] >= 2 && eiss[e] == hand[c] && outc[e] != O_RELEASED ->
          assert(!moved[c]); hold[c] = 1          /* still its: nobody else may have it */
       :: else -> skip
       fi;
       STEPPED; CLEAN }

  /* ---- a PUT gives up (ledger_wait_s: 503, nothing answered): its entry or its
   *      outcome was lost with Redis state (replaying: or it timed out: the code gives
   *      up on any PUT after ledger_wait_s) ---- */
  :: atomic { WHEN(A_GIVE_UP, stranded != 0 || GIVE_UP_ANY) ->
#ifdef REPLAY
       PARAM1(e); assert(e > 0 && e < ne && eop[e] != ISSUE && !eans[e]);
#else
       e = 1;
       do
       :: e < ne && (stranded & bitof(e)) == 0 -> e++
       :: e < ne && (stranded & bitof(e)) != 0 -> break
       od;
#endif
       eans[e] = 1; c = ecli[e];
       if :: eop[e] == REL && hold[c] == 2 && eiss[e] == hand[c] -> hold[c] = 3 :: else -> skip fi;
       printf("give up: entry %d\n", e);
       STEPPED; CLEAN }

  /* ---- a PUT is abandoned before it appended its change (replaying: the code's wait
   *      for keysync to catch up timed out, or a store failed: 503) ---- */
  :: atomic { WHEN(A_ABANDON, GIVE_UP_ANY && ANY_C(HAS_PUT)) ->
       PICK_C(HAS_PUT);
       pu[c] = 0; pw[c] = 0;
       STEPPED; CLEAN }

  /* ---- a keysync's turn looks at the record (LedgerDrain.watch: a restore pending
   *      or a halt comes first), then reads a batch (LedgerStream.read: its own pending
   *      entries first, then the oldest new ones; one or two) ---- */
#ifdef REPLAY
  /* replaying: the watch came before a read that blocked (XREADGROUP's BLOCK) across a
   * fence or a halt; what it delivers is judged at the commit, by the guard */
#define READ_WATCHED true
#else
#define READ_WATCHED (!lhalted && rto == 0)
#endif
#ifdef REPLAY
#define CAN_READ_R(k) (CAN_READ(k) || (ks[k] == IDLE && kkeep[k] != 0))
#else
#define CAN_READ_R(k) CAN_READ(k)
#endif
  :: atomic { WHEN(A_READ, READ_WATCHED && ANY_K(CAN_READ_R)) ->
       PICK_K(CAN_READ_R);
       PARAM2(n);
#ifdef REPLAY
       /* 3: the batch its turn kept in memory across a restore, again */
       if
       :: n == 3 -> assert(kkeep[k] != 0); kb[k] = kkeep[k]; kkeep[k] = 0
       :: else ->
#endif
       kb[k] = 0; e = 1;
       do
       :: e < ne -> if :: est[e] == 2 + k -> kb[k] = kb[k] | bitof(e) :: else -> skip fi; e++
       :: e >= ne -> break
       od;
       if
       :: kb[k] == 0 ->
          e = 1;
          do
          :: est[e] != UNREAD -> e++
          :: est[e] == UNREAD -> break
          od;
          est[e] = 2 + k; kb[k] = bitof(e);
          /* the next entry the stream still holds (one Redis lost is skipped) */
          t = e + 1;
          do
          :: t < ne && est[t] == LOST -> t++
          :: else -> break
          od;
#ifdef REPLAY
          if
          :: n == 2 && t < ne && est[t] == UNREAD -> est[t] = 2 + k; kb[k] = kb[k] | bitof(t)
          :: else -> assert(n != 2)
          fi
#else
          if
          :: t < ne && est[t] == UNREAD -> est[t] = 2 + k; kb[k] = kb[k] | bitof(t)
          :: true -> skip
          fi
#endif
       :: else -> skip
       fi;
#ifdef REPLAY
       fi;
#endif
       ks[k] = HOLDING;
       printf("read: keysync %d batch %d\n", k, kb[k]);
       STEPPED; CLEAN }

  /* ---- another keysync claims a live one's batch, or the entries a stopped one left
   *      pending (LedgerStream.read: XAUTOCLAIM after ledger_claim_idle_s): a live
   *      one's and the claimer may both decide the same entries ---- */
  :: atomic { WHEN(A_CLAIM, b_claim > 0 && NKS > 1 && ANY_K(CAN_BE_CLAIMED)) ->
       PICK_K(CAN_BE_CLAIMED);
       u = 3 - k;
       b_claim--;
       if
       :: kb[k] == 0 ->   /* stopped, between turns, or restoring: every entry pending under it */
          kb[u] = 0; e = 1;
          do
          :: e < ne -> if :: est[e] == 2 + k -> est[e] = 2 + u; kb[u] = kb[u] | bitof(e) :: else -> skip fi; e++
          :: e >= ne -> break
          od
       :: else ->
          e = 1;
          do
          :: e < ne -> if :: (kb[k] & bitof(e)) != 0 && est[e] == 2 + k -> est[e] = 2 + u :: else -> skip fi; e++
          :: e >= ne -> break
          od;
          kb[u] = kb[k]
       fi;
       ks[u] = HOLDING;
       printf("claim: keysync %d takes keysync %d's batch\n", u, k);
       STEPPED; CLEAN }

  /* ---- its ledger transaction reads the record it is judged against
   *      (LedgerDrain._transact: GuardedCold.record) ---- */
  :: atomic { WHEN(A_BEGIN, !fhalted && !untrusted && ANY_K(HOLDING_K)) ->
       PICK_K(HOLDING_K);   /* replaying: BEGUN too (the record read again) */
       krec[k] = rec; ks[k] = BEGUN;
       STEPPED; CLEAN }

  /* ---- it decides its batch in one guarded transaction, logged before it commits
   *      (LedgerDrain._once: decide.apply, GUARD_LEDGER, add_link, COMMIT); refused,
   *      it holds the batch for its next attempt (LedgerDrain._refused) ---- */
  :: atomic { WHEN(A_COMMIT, nn < MAXN && ANY_K(BEGUN_K)) ->
       PICK_K(BEGUN_K);
       covers(srv, krec[k]);
       if
       :: r && ON_TIMELINE(krec[k]) && NO_RESTORE_HERE && !fhalted ->
          ledger_node();
          decide_batch(k);
          ks[k] = COMMITTED; knode[k] = srv;
          printf("commit: keysync %d node %d (live %d used %d hist %d)\n", k, srv, live[srv], used[srv], hist[srv])
       :: else -> ks[k] = HOLDING; krec[k] = 0; printf("refused: keysync %d\n", k)
       fi;
       STEPPED; CLEAN }

  /* ---- its confirmation (LedgerStream.confirm_link, lua/ledger_confirm.lua): the stamp
   *      recorded; then a completed restore cleared, outcomes published (once), entries
   *      acknowledged; refused, the entries stay pending under it ---- */
  :: atomic { WHEN(A_CONFIRM, !untrusted && ANY_K(COMMITTED_K)) ->
       PICK_K(COMMITTED_K);
       n = knode[k];
       record(n, ok);
       printf("confirm: keysync %d node %d recorded %d\n", k, n, ok);
       if
       :: ok ->
#ifdef LOG_AFTER_COMMIT
          inlog[n] = 1;
#endif
#ifdef CLEAR_ONLY_ITS_RESTORE
          if :: rest[n] != 0 && rto == rest[n] -> rto = 0 :: else -> skip fi;
#else
          /* any link the record accepts follows the restore pending (the guard passes
           * nothing else on that history before it): the restore is done, and the
           * record's head, not the restore's target, is what a later fence restores */
          rto = 0;
#endif
          trimnext = 1;
          e = 1;
          do
          :: e < ne ->
             if
             /* acknowledged, and its outcome published: an entry Redis lost since it
              * was read too (ledger_confirm.lua publishes every decided outcome) */
             :: (kb[k] & bitof(e)) != 0 ->
                if :: est[e] != LOST -> est[e] = ACKED :: else -> skip fi;
                if :: eop[e] != ISSUE && outc[e] == 0 -> outc[e] = kso[e] :: else -> skip fi
             :: else -> skip
             fi;
             e++
          :: e >= ne -> break
          od
#ifdef REPLAY_AFTER_NEXT_BATCH
          ;
          t = 1;
          do
          :: t < MAXN -> if :: old[t] && inlog[t] -> inlog[t] = 0; gone[t] = 1 :: else -> skip fi; t++
          :: t >= MAXN -> break
          od
#endif
       :: else ->
#ifdef TRIM_WHEN_REFUSED
          trimnext = 1;
#endif
          skip
       fi;
       ks[k] = IDLE; kb[k] = 0; krec[k] = 0; knode[k] = 0;
       STEPPED; CLEAN; trimok = trimnext; trimnext = 0 }

  /* ---- a keysync dies: what it read stays pending under it (the stream's pending
   *      list), read first by itself restarted (the same consumer name) or claimed by
   *      another (A_CLAIM); newer entries are read by others meanwhile ---- */
  :: atomic { WHEN(A_CRASH, b_crash > 0 && ANY_K(BUSY_K)) ->
       PICK_K(BUSY_K);
       b_crash--;
       printf("crash: keysync %d\n", k);
       ks[k] = IDLE; kb[k] = 0; krec[k] = 0; knode[k] = 0; ktarget[k] = 0;
       STEPPED; CLEAN }

  /* ---- keysync takes K from the cold table (Keysync.refill: GuardedCold.begin_take,
   *      GUARD_TAKE), then pushes it (push.lua: its stamp recorded first). A push
   *      waits for a record Redis lost to be trusted again (Keysync.push: refused
   *      'untrusted', it vouches and tries again; refused by its pin, it pins the new
   *      server and tries again) ---- */
#ifdef REPLAY
  /* replaying, a take is the code's two steps: the record read (GuardedCold.record:
   * halted, it refuses; untrusted, it vouches first), then the transaction, its guard
   * judged against that record (a record Redis lost since, as a refill waiting for the
   * clock row's lock behind another keysync's commit finds it) */
  :: atomic { WHEN(A_TAKE_BEGIN, GUARD_PASSES && ANY_K(TAKE_FREE)) ->
       PICK_K(TAKE_FREE);
       krec[k] = rec; ks[k] = TAKE_BEGUN;
       STEPPED; CLEAN }
  :: atomic { WHEN(A_TAKE, nn < MAXN && ANY_K(TAKE_K)) ->
       PICK_K(TAKE_K);
       covers(srv, krec[k]); assert(r && cold[srv]);
       newnode(); cold[srv] = 0; ks[k] = TAKEN; knode[k] = srv; krec[k] = 0;
       printf("take: node %d\n", srv);
       STEPPED; CLEAN }
#else
  :: atomic { WHEN(A_TAKE, cold[srv] && GUARD_PASSES && !behind && nn < MAXN && ANY_K(IDLE_K)) ->
       PICK_K(IDLE_K);
       newnode(); cold[srv] = 0; ks[k] = TAKEN; knode[k] = srv; printf("take: node %d\n", srv);
       STEPPED; CLEAN }
#endif
  :: atomic { WHEN(A_PUSH, !untrusted && ANY_K(TAKEN_K)) ->
       PICK_K(TAKEN_K);
       record(knode[k], ok);
       if :: ok -> hot = 1 :: else -> skip fi;   /* else lost, never pushed */
       printf("push: recorded %d\n", ok);
       ks[k] = IDLE; knode[k] = 0;
       STEPPED; CLEAN }

  /* ---- the requeue (LedgerDrain.requeue_released, decide.requeue): a ledger
   *      transaction of its own, every ledger_requeue_every_s, whether or not a release
   *      is due (then its link writes nothing); a due release's key goes back to the
   *      cold table unless an issue of it is live ---- */
  :: atomic { WHEN(A_RQ_BEGIN, b_req > 0 && !fhalted && !untrusted && ANY_K(RQ_FREE)) ->
       PICK_K(RQ_FREE);
       krec[k] = rec; ks[k] = RQ_BEGUN;
       STEPPED; CLEAN }
#ifdef REPLAY
#define RQ_MOVES (tp2[step] == 1)
#define RQ_WAITS (tp2[step] == 0)
#else
#define RQ_MOVES true
#define RQ_WAITS true
#endif
  :: atomic { WHEN(A_RQ_COMMIT, nn < MAXN && ANY_K(RQ_K)) ->
       PICK_K(RQ_K);
       covers(srv, krec[k]);
       if
       :: r && ON_TIMELINE(krec[k]) && NO_RESTORE_HERE && !fhalted && b_req > 0 ->
          b_req--;
          ledger_node();
          /* a release is due once older than reissue_after_s: a requeue finds it due,
           * or not yet (REPLAY: the trace's second parameter says which) */
          if
          :: RQ_MOVES && REQUEUE_DUE ->
             if :: live[srv] == 0 -> cold[srv] = 1 :: else -> skip fi;   /* never a live key */
             req[srv] = hist[srv]; wrote(OP_REQ)
          :: RQ_WAITS -> skip
          fi;
          ks[k] = COMMITTED; knode[k] = srv; kb[k] = 0;
          printf("requeue: node %d cold %d\n", srv, cold[srv])
       :: else -> ks[k] = IDLE; krec[k] = 0
       fi;
       STEPPED; CLEAN }

  /* ---- a promoted server whose history covers the record adopts its timeline
   *      (postgres_fence.settle(adopt=True), _adopt: a guarded write, and the record
   *      claimed for it before it commits; a claim refused, 'moved', rolls it back) ---- */
  :: atomic { WHEN(A_ADOPT, ADOPT_PATH && tl[rec] != curtl && GUARD_PASSES && !behind && nn < MAXN) ->
       newnode(); isadopt[srv] = 1; rec = srv; rhead = lhead[srv]; rsref = 0;
       printf("adopt: node %d\n", srv);
       STEPPED; CLEAN }

  /* ---- the fence (postgres_fence.settle, _fence, _restore_target): a guarded write
   *      found the primary's history behind the record: discard, claim, and leave a
   *      restore pending: the server's own, else the record's, else the record's head,
   *      unless the server holds that link ---- */
  :: atomic { WHEN(A_FENCE, GUARD_PASSES && behind && nn < MAXN) ->
       newnode();
       isfence[srv] = 1;
       cold[srv] = 0;                             /* discarded, never reissued */
#ifdef REPLAY_REDECIDES
       req[srv] = hist[srv];                      /* round 4: settle every release */
#endif
#ifdef HEAD_ONLY_TARGET
       x = rhead;
#else
       x = rto; if :: x == 0 -> x = rhead :: else -> skip fi;
#endif
#ifdef PENDING_FIRST
       if :: pto[srv] != 0 -> x = pto[srv] :: else -> skip fi;
#endif
       if
       :: x != 0 -> onchain(x); if :: r -> x = 0 :: else -> pto[srv] = x fi
       :: else -> skip
       fi;
       if :: rto == 0 -> rto = x :: else -> skip fi;   /* reset_record.lua keeps one */
       rec = srv; rhead = lhead[srv]; rsref = 0; rflost = 0;
       printf("fence: node %d restore pending %d (record %d)\n", srv, pto[srv], rto);
       STEPPED; CLEAN }

#ifndef REPLAY_AFTER_NEXT_BATCH
  /* ---- the restore (LedgerDrain.restore): a keysync that sees a restore pending (its
   *      watch, or a refusal) reads the record its restore is judged against and takes
   *      its target: the record's pending restore, else the server's ---- */
#ifdef REPLAY
  /* replaying: the restore another keysync committed since this one saw it pending
   * (the trace's second parameter: its target, a link the primary holds now): its
   * transaction finds nothing to write, a link of no operations */
#define RS_HELD (tp2[step] != 0 && (held[srv] & (1 << tp2[step])) != 0)
#else
#define RS_HELD false
#endif
#ifdef REPLAY
#define RS_RETRY true
#else
#define RS_RETRY (!rsref)     /* a refused restore begins again once something changed */
#endif
  :: atomic { WHEN(A_RS_BEGIN, (rto != 0 || pto[srv] != 0 || RS_HELD) && RS_RETRY && !fhalted && !untrusted && !lhalted && ANY_K(RS_FREE)) ->
       PICK_K(RS_FREE);
       krec[k] = rec; ks[k] = RS_BEGUN;
       ktarget[k] = rto; if :: ktarget[k] == 0 -> ktarget[k] = pto[srv] :: else -> skip fi;
#ifdef REPLAY
       if :: ktarget[k] == 0 -> ktarget[k] = tp2[step] :: else -> skip fi;
#endif
       STEPPED; CLEAN }

  /* ---- its transaction (LedgerDrain._restoring, _chain): under the ledger's lock, walk
   *      the log from the target back to a link the primary holds and write those links
   *      again as written, in one ledger transaction that is itself a link; it passes the
   *      guard for its own target only (another a later fence put in its place refuses
   *      it); a link gone from the log halts the ledger ---- */
#ifdef STALE_TARGET
#define RS_MOOT false
#else
#define RS_MOOT (n != rto && n != pto[srv])
#endif
  :: atomic { WHEN(A_RESTORE, nn < MAXN && ANY_K(RS_K)) ->
       PICK_K(RS_K);
       n = ktarget[k];
       /* its target pending no more (neither the record's nor the server's: another
        * keysync restored it, or a fence put another in its place, restored since):
        * nothing to walk or write, a link of no operations (LedgerDrain._restoring) */
       if
       :: RS_MOOT -> r = 1; o = 1
       :: else -> chain_intact(n); o = 0   /* the walk first, in the transaction, the guard after */
       fi;
       if
       :: !r && !fhalted && !lhalted ->
          /* a link is gone: fail closed. Only a link trimmed before the fence, or lost
           * with Redis state, may do this (the log holds every committed link else) */
          assert(gone[m] == 1 || gone[m] == 3);
          lhalted = 1; ks[k] = IDLE; krec[k] = 0; ktarget[k] = 0;
          printf("halt: link %d gone\n", m)
       :: else ->
          covers(srv, krec[k]);
          if
          :: r && ON_TIMELINE(krec[k]) && (pto[srv] == 0 || pto[srv] == ktarget[k]) && !fhalted && !lhalted ->
             ledger_node();
#ifdef REPLAY_REDECIDES
             redecide(n);
#else
             if :: o == 0 -> restore_ops(n) :: else -> skip fi;
#endif
             rest[srv] = n; pto[srv] = 0;
             ks[k] = COMMITTED; knode[k] = srv; kb[k] = 0; ktarget[k] = 0;
             printf("restore: node %d up to %d (live %d used %d hist %d)\n", srv, n, live[srv], used[srv], hist[srv])
          :: else ->     /* refused: settle, begin again (at once when the record moved since) */
             if :: krec[k] == rec -> rsref = 1 :: else -> skip fi;
             ks[k] = IDLE; krec[k] = 0; ktarget[k] = 0
          fi
       fi;
       STEPPED; CLEAN }
#else
  /* ---- round 4: the restore runs after a batch was acknowledged (and trimmed) ---- */
  :: atomic { WHEN(A_RESTORE, (rto != 0 || pto[srv] != 0) && GUARD_PASSES && !behind && nn < MAXN && ks[1] == IDLE) ->
       n = rto; if :: n == 0 -> n = pto[srv] :: else -> skip fi;
       chain_intact(n);
       if
       :: !r -> rto = 0; pto[srv] = 0; rhead = lhead[srv]   /* nothing kept: none */
       :: r ->
          ledger_node();
          restore_ops(n);
          rest[srv] = n; pto[srv] = 0;
          ks[1] = COMMITTED; knode[1] = srv; kb[1] = 0
       fi;
       STEPPED; CLEAN }
#endif

  /* ---- time passes: the log's oldest entry is trimmed by the confirmation just
   *      accepted, in its own script (ledger_confirm.lua: after it cleared the restore
   *      pending; a refused one trims nothing); one confirmation may trim several ---- */
  :: atomic { WHEN(A_TRIM, b_trim > 0 && trimok && anylog) ->
       b_trim--;
       t = 1;
       do
       :: !inlog[t] -> t++
       :: inlog[t] -> break
       od;
#ifdef REPLAY_AFTER_NEXT_BATCH
       u = 1;
       do
       :: u < MAXN -> if :: inlog[u] -> old[u] = 1 :: else -> skip fi; u++
       :: u >= MAXN -> break
       od;
#else
       inlog[t] = 0;
       /* why it left: 1 with no restore pending, or before the fence saw a promotion
        * (the log's retention outlives the fence's detection time: settings.py
        * promotion_detected_s); 3 lost with Redis state; 2 else (a halt for it later
        * is a needless one) */
       if
       :: tl[rec] != curtl -> gone[t] = 1
       :: tl[rec] == curtl && rto == 0 && pto[srv] == 0 -> gone[t] = 1
       :: tl[rec] == curtl && rto == 0 && pto[srv] != 0 && rflost -> gone[t] = 3
       :: else -> gone[t] = 2
       fi;
#endif
       STEPPED; CLEAN; trimok = 1 }

  /* ---- a client retries its pop with the same Idempotency-Key: the same answer
   *      (pop_idempotent.lua; a record older than the fence is never replayed) ---- */
  :: atomic { WHEN(A_RETRY, b_retry > 0 && ANY_C(CAN_RETRY)) ->
       PICK_C(CAN_RETRY);
       b_retry--;
       assert(hold[c] == 1 && hand[c] == idem[c]);   /* never a key it gave back */
       printf("retry: client %d replayed issue %d\n", c, idem[c]);
       STEPPED; CLEAN }

  /* ---- Redis loses state (fence.lua on the new server: lists discarded, the record
   *      untrusted): x = 1 a failover to a replica that lacked the newest writes,
   *      2 a restart empty, 3 a restart from an older snapshot; m: which of the newest
   *      writes the copy lacked (1 an entry, 2 an acknowledgement, 4 a published
   *      outcome, 8 a log entry, 16 the pending restore) ---- */
  :: atomic { WHEN(A_RLOSS, b_rloss > 0) ->
       b_rloss--;
#ifdef REPLAY
       PARAM1(x); PARAM2(m);
#else
       if :: x = 1 :: RLOSS_KINDS > 1 -> x = 2 :: RLOSS_KINDS > 1 -> x = 3 fi;
       m = 0;
       if :: x != 2 && (RLOSS_MASK & 1) -> if :: m = m | 1 :: skip fi :: else -> skip fi;
       if :: x != 2 && (RLOSS_MASK & 2) -> if :: m = m | 2 :: skip fi :: else -> skip fi;
       if :: x != 2 && (RLOSS_MASK & 4) -> if :: m = m | 4 :: skip fi :: else -> skip fi;
       if :: x != 2 && (RLOSS_MASK & 8) -> if :: m = m | 8 :: skip fi :: else -> skip fi;
       if :: x != 2 && (RLOSS_MASK & 16) -> if :: m = m | 16 :: skip fi :: else -> skip fi;
#endif
       hot = 0;
       idem[CA] = 0; idem[CB % 3] = 0;               /* records older than the fence: never replayed */
       untrusted = 1;
#ifdef REPLAY
       /* a vouch committed before this loss is not written after it (vouch_record.lua:
        * the record's epoch, fenced_at, moved on: 'stale') */
       t = 1;
       do
       :: t < MAXN -> isvouch[t] = 0; t++
       :: t >= MAXN -> break
       od;
#endif
       if
       :: x == 4 -> inloss = 1                       /* replaying: the pieces follow */
       :: x == 2 ->                                  /* empty: every entry, the log, the record */
          t = 1;
          do
          :: t < ne -> if :: est[t] != ACKED -> est[t] = LOST :: else -> skip fi; if :: !eans[t] -> outc[t] = 0 :: else -> skip fi; t++
          :: t >= ne -> break
          od;
          t = 1;
          do
          :: t < MAXN -> if :: inlog[t] -> inlog[t] = 0; gone[t] = 3 :: else -> skip fi; t++
          :: t >= MAXN -> break
          od;
          if :: rto != 0 -> rflost = 1 :: else -> skip fi;
          rec = 0; rhead = 0; rto = 0; lhalted = 0
       :: x != 2 && x != 4 ->                        /* a lagging copy: the newest writes */
          if
          :: (m & 1) != 0 ->
             t = ne - 1;
             do
             :: t > 0 && (est[t] == ACKED || est[t] == LOST) -> t--
             :: t > 0 && est[t] != ACKED && est[t] != LOST -> est[t] = LOST; break
             :: t == 0 -> break
             od
          :: else -> skip
          fi;
          if
          :: (m & 2) != 0 ->
             t = ne - 1;
             do
             :: t > 0 && est[t] != ACKED -> t--
             :: t > 0 && est[t] == ACKED -> est[t] = UNREAD; break
             :: t == 0 -> break
             od
          :: else -> skip
          fi;
          if
          :: (m & 4) != 0 ->
             t = ne - 1;
             do
             :: t > 0 && (outc[t] == 0 || eans[t]) -> t--
             :: t > 0 && outc[t] != 0 && !eans[t] -> outc[t] = 0; break
             :: t == 0 -> break
             od
          :: else -> skip
          fi;
          if
          :: (m & 8) != 0 ->
             t = MAXN - 1;
             do
             :: t > 0 && !inlog[t] -> t--
             :: t > 0 && inlog[t] -> inlog[t] = 0; gone[t] = 3; break
             :: t == 0 -> break
             od
          :: else -> skip
          fi;
          /* the record's newest change: its pending restore, or the ledger's halt */
          if :: (m & 16) != 0 && rto != 0 -> rto = 0; rflost = 1 :: else -> skip fi;
          if :: (m & 16) != 0 -> lhalted = 0 :: else -> skip fi
       fi;
       /* keysyncs' reads and confirmations in flight fail: their batches stay pending */
       printf("redis loss: kind %d lost %d\n", x, m);
       STEPPED; CLEAN }

#ifdef REPLAY
  /* ---- replaying: a keysync gives its turn up (an error: a store unavailable, the
   *      guard refusing every attempt, a confirmation that failed): the batch it held is
   *      dropped, its entries stay pending under it, its next turn reads them first; a
   *      refill's batch not pushed is lost. (A crash, which the search explores, does all
   *      this and more: its entries go to any keysync.) ---- */
  :: atomic { WHEN(A_DROP, ANY_K(BUSY_NOW)) ->
       PICK_K(BUSY_NOW);
       PARAM2(x);   /* 1: the batch kept in memory, its refusal's restore first */
       if :: x == 1 -> kkeep[k] = kb[k] :: else -> skip fi;
       ks[k] = IDLE; kb[k] = 0; krec[k] = 0; knode[k] = 0; ktarget[k] = 0;
       STEPPED; CLEAN }

  /* ---- replaying: a Redis loss as it happened, piece by piece, between A_RLOSS of kind
   *      4 (the identity changed: lists discarded, the record untrusted, Idempotency-Key
   *      records gone) and A_LOSS_END: each entry's state taken back (gone; an
   *      acknowledgement lost: pending again, under its reader or none; a delivery
   *      lost: unread), an outcome, a log entry, the pending restore lost ---- */
  :: atomic { WHEN(A_LOSS_ENTRY, inloss) ->
       PARAM1(e); PARAM2(x);
       assert(e > 0 && e < ne);
       assert(x == LOST || (x == UNREAD && est[e] != LOST) || (x >= 3 && x <= 5 && est[e] == ACKED));
       est[e] = x;
       STEPPED; CLEAN }
  :: atomic { WHEN(A_LOSS_OUTCOME, inloss) ->
       PARAM1(e); assert(e > 0 && e < ne && outc[e] != 0 && !eans[e]);
       outc[e] = 0;
       STEPPED; CLEAN }
  /* (also after a loss, before the vouch: a link written to the Redis that was lost,
   *  its transaction committed after) */
  :: atomic { WHEN(A_LOSS_LINK, inloss || untrusted) ->
       PARAM1(x); assert(x > 0 && x < nn && inlog[x]);
       inlog[x] = 0; gone[x] = 3;
       STEPPED; CLEAN }
  :: atomic { WHEN(A_LOSS_RESTORE, inloss) ->
       PARAM1(x);
       if
       :: x == 0 -> assert(rto != 0); rto = 0; rflost = 1
       :: x == 1 -> assert(lhalted); lhalted = 0    /* the ledger's halt (Redis only) */
       fi;
       STEPPED; CLEAN }
  :: atomic { WHEN(A_LOSS_END, inloss) ->
       inloss = 0;
       STEPPED; CLEAN }
#endif

  /* ---- the first guarded write after it rebuilds the record from PostgreSQL
   *      (settle: vouch_record.lua, with the server's pending restore), or halts when
   *      PostgreSQL forked since its last guarded write or is behind what Redis still
   *      knows (verdict.py) ---- */
  :: atomic { WHEN(A_VOUCH, untrusted && !fhalted && nn < MAXN) ->
       PARAM1(x); assert(x < nn);
       if
       :: x == 0 ->
          /* the verdict, the guarded write (VOUCH: a commit of its own) and the
           * record rebuilt from it, at once */
          covers(srv, rec);
          if
          :: tl[srv] == curtl && r -> newnode(); x = srv
          :: else -> fhalted = 1; printf("halt: both tiers lost state\n")
          fi
#ifdef REPLAY
       :: else -> assert(isvouch[x]); isvouch[x] = 0  /* rebuilt from node x, VOUCH's commit */
#endif
       fi;
       if
       :: !fhalted ->
          rec = x; rhead = lhead[x]; rto = pto[x]; untrusted = 0; rsref = 0;
          printf("vouch: node %d\n", x)
       :: else -> skip
       fi;
       STEPPED; CLEAN }
#ifdef REPLAY
  /* ---- the vouch in the code's two steps: VOUCH commits (the verdict under the
   *      clock row's lock), then vouch_record.lua rebuilds the record from that
   *      commit (A_VOUCH with its node), or finds it rebuilt by another ---- */
  :: atomic { WHEN(A_VOUCH_COMMIT, untrusted && !fhalted && nn < MAXN) ->
       covers(srv, rec); assert(tl[srv] == curtl && r);
       newnode(); isvouch[srv] = 1; printf("vouch commit: node %d\n", srv);
       STEPPED; CLEAN }
#endif

  /* ---- a PostgreSQL promotion: the replica had replayed up to the primary's latest
   *      commit or one of its ancestors ---- */
  :: atomic { WHEN(A_PROMOTE, b_prom > 0 && srv != 0) ->
       b_prom--; rsref = 0;
#ifdef REPLAY
       PARAM1(x); covers(srv, x); assert(r);
#else
       x = srv;
       do
       :: x != 0 -> x = par[x]
       :: true -> break
       od;
#endif
       srv = x; curtl++;
       printf("promotion: the primary is now node %d, timeline %d\n", srv, curtl);
       STEPPED; CLEAN }

  /* ---- a lookup (reader.py LedgerReader._read): the record read (refused while
   *      halted or restoring); a snapshot with the clock row (refused unless that
   *      server's history covers the record, with no restore pending); answered once
   *      the record, on the same history, covers the snapshot ---- */
  :: atomic { WHEN(A_LOOK_RECORD, b_look > 0 && ANY_C(CAN_LOOK)) ->
       PICK_C(CAN_LOOK);
       b_look--; lk[c] = 1; lr[c] = rec; lmin[c] = seen;
       lthen[c] = truth[hand[c]];
       STEPPED; CLEAN }
  :: atomic { WHEN(A_LOOK_SNAPSHOT, ANY_C(IN_LOOK1)) ->
       PICK_C(IN_LOOK1);
       /* x 1: the snapshot taken after an adoption's claim and before its commit: the
        * server as it was before the adoption's node (which writes nothing of the
        * ledger) */
#ifdef REPLAY
       PARAM2(x); assert(x == 0 || isadopt[srv]);
#else
       if :: x = 0 :: isadopt[srv] -> x = 1 fi;
#endif
       if :: x == 1 -> n = par[srv] :: else -> n = srv fi;
       covers(n, lr[c]);
       if
       :: r && pto[n] == 0 -> lk[c] = 2; ls[c] = n
       :: else -> lk[c] = 0; lr[c] = 0; lmin[c] = 0; lthen[c] = 0   /* 503 */
       fi;
       STEPPED; CLEAN }
#ifdef LOOKUP_NO_WAIT
#define LOOK_COVERED(c) true
#else
#define LOOK_COVERED(c) (tl[rec] == tl[lr[c]] && r)
#endif
  :: atomic { WHEN(A_LOOK_ANSWER, ANY_C(IN_LOOK2)) ->
       PICK_C(IN_LOOK2);
       PARAM2(x);   /* REPLAY: 1, the code answered 503 for a reason of its own (an error) */
       covers(rec, ls[c]);
       if
       /* the record read first covered the snapshot: answered with nothing read again
        * (LedgerReader._read); else the record read again must cover it, on the same
        * history (its timeline and fork: a Redis loss and its vouch keep them, a fence
        * or an adoption moves them), neither halted nor restoring */
       :: x == 0 && (ls[c] == lr[c] || (LOOK_COVERED(c) && !lhalted && rto == 0 && !untrusted)) ->
          look_answer(c, ls[c]);
          printf("lookup: client %d answered from node %d\n", c, ls[c])
       :: else -> skip                                                   /* 503 */
       fi;
       lk[c] = 0; lr[c] = 0; ls[c] = 0; lmin[c] = 0; lthen[c] = 0;
       STEPPED; CLEAN }

#ifndef REPLAY
  /* ---- nothing else can happen (every fault spent): every entry is applied, every
   *      restore done, every PUT answered, unless the ledger failed closed or the
   *      search ran out of nodes (its bound) ---- */
  :: timeout ->
     if
     :: nn < MAXN && !lhalted && !fhalted ->
        assert(rto == 0 && pto[srv] == 0 && !untrusted);
        assert(pu[CA] == 0 && pu[CB % 3] == 0);
        t = 1;
        do
        :: t < ne -> assert(est[t] == ACKED || est[t] == LOST); assert(eop[t] == ISSUE || eans[t]); t++
        :: t >= ne -> break
        od
     :: else -> skip
     fi;
     break
#else
  :: atomic { step >= NSTEPS ->
       printf("REPLAYED %d\n", step);
       printf("STATE srv=%d nn=%d ne=%d rec=%d rhead=%d rto=%d curtl=%d hot=%d untrusted=%d lhalted=%d fhalted=%d\n",
              srv, nn, ne, rec, rhead, rto, curtl, hot, untrusted, lhalted, fhalted);
       printf("HERE live=%d used=%d hist=%d req=%d cold=%d lhead=%d pto=%d app=%d dv=%d\n",
              live[srv], used[srv], hist[srv], req[srv], cold[srv], lhead[srv], pto[srv], app[srv], dv[srv]);
       break }
#endif
  od
}

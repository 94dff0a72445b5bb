/*
 * keydispenser: the ledger's protocol and the PostgreSQL fence, as a model for SPIN.
 *
 * docs/reliability.md ("The ledger's one history") says what is modelled, the bounds,
 * and how each action maps to the code; tests/model/test_ledger_model.py runs it.
 *
 * One key, K, of a type with a ledger and reissue_released; two API clients, A and B.
 * Every action is one atomic step of the real protocol (a Lua script, a PostgreSQL
 * transaction, an HTTP answer), and SPIN explores every interleaving of them.
 *
 * PostgreSQL is a tree of commits ("nodes"): each transaction adds a child of the
 * primary's latest node; a promotion makes an ancestor the primary's latest (the
 * replica had replayed up to it: a suffix of commits is lost). A node holds the state
 * after its commit: K's ledger rows, whether K is in the cold table, the ledger chain's
 * head. Redis holds the hot list, the stream of ledger entries, the sync record (the
 * newest stamp recorded, and the ledger head it carried), the ledger log (one entry per
 * ledger transaction: its id, the head before it, and what it wrote) and the outcomes.
 *
 * Switches (-D):
 *   Workloads, one at a time: W_PAIR, W_REISSUE, W_QUIET, W_MIXED.
 *   REPLAY_REDECIDES         round 4's restore: the lost batches' entries are decided
 *                            again, in stream order, issues first, after the fence
 *                            settled every release (instead of applying what the log
 *                            recorded).
 *   REPLAY_AFTER_NEXT_BATCH  round 4's schedule: nothing waits for the restore (the
 *                            ledger decides and answers meanwhile); it runs after the next
 *                            batch's acknowledgement, which trims the log first.
 *   LOG_AFTER_COMMIT         the log entry is written with the acknowledgement, after
 *                            the commit (not before it): a fence may find a gap.
 */

#define NONE 0
#define CA 1
#define CB 2

#define ISSUE 1
#define USE 2
#define REL 3

#define UNREAD 1
#define ACKED 9                 /* entry states; held by keysync k: 2 + k */

#define O_ASSIGNED 1            /* outcomes of a status change (MOSIP's PUT) */
#define O_RELEASED 2
#define O_REFUSED 3             /* not ISSUED any more (used, or given back) */
#define O_NOTFOUND 4

#define T_ASSIGNED 1            /* what an answer told a client about its issue */
#define T_RELEASED 2

#define IDLE 0                  /* keysync states */
#define HOLDING 1               /* read a batch */
#define COMMITTED 2             /* committed a ledger transaction, not acknowledged */
#define TAKEN 3                 /* committed a take of K, not pushed */
#define ADOPTING 4              /* committed a write on a new timeline, not recorded */

#define MAXE 8                  /* stream entries 1..7 */
#define MAXN 18                 /* commit nodes 1..17; node 0: the migrated database */
#define bitof(e) (1 << (e))

#if defined(REPLAY_REDECIDES) || defined(REPLAY_AFTER_NEXT_BATCH) || defined(LOG_AFTER_COMMIT)
#define VARIANT 1
#endif

/* ---- workloads: how many of each action the clients and the faults may take ---- */
#if defined(W_PAIR)
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
#define REDIS_FAILOVERS 0
#define RETRIES 0
#elif defined(W_REISSUE)
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
#define REDIS_FAILOVERS 0
#define RETRIES 0
#elif defined(W_QUIET)
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
#define REDIS_FAILOVERS 0
#define RETRIES 0
#elif defined(W_MIXED)
#define NKS 2
#define POPS 2
#define PUTS 2
#define PAIRS 0
#define REPEATS 1
#define PROMOTIONS 1
#define CRASHES 1
#define REQUEUES 1
#define TRIMS 1
#define CLIENTS 2
#define REDIS_FAILOVERS 0
#define RETRIES 0
#elif defined(W_TWICE)
#define NKS 1
#define POPS 2
#define PUTS 2
#define PAIRS 0
#define REPEATS 1
#define PROMOTIONS 2
#define CRASHES 1
#define REQUEUES 1
#define TRIMS 0
#define CLIENTS 2
#define REDIS_FAILOVERS 0
#define RETRIES 0
#elif defined(W_REDIS)
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
#define REDIS_FAILOVERS 1
#define RETRIES 1
#else
#error "choose a workload: -DW_PAIR, -DW_REISSUE, -DW_QUIET, -DW_MIXED, -DW_TWICE or -DW_REDIS"
#endif

/* ---- the stream of ledger entries (Redis) ---- */
byte eop[MAXE];                 /* ISSUE (a pop), USE (PUT ASSIGNED), REL (PUT UNASSIGNED) */
byte ecli[MAXE];                /* the client */
byte eiss[MAXE];                /* a PUT's: the issue (entry) it is about */
byte est[MAXE];                 /* UNREAD, held by keysync k (2 + k), ACKED */
bit eans[MAXE];                 /* a PUT answered */
byte outc[MAXE];                /* its outcome, recorded with the acknowledgement */
byte ne = 1;
byte nack = 0;                  /* entries acknowledged */

/* ---- PostgreSQL: the commit tree ---- */
byte par[MAXN];                 /* parent node */
byte live[MAXN];                /* K's live issue row: the entry that issued it (0: none) */
bit used[MAXN];                 /* the live row is ASSIGNED */
byte hist[MAXN];                /* issues given back (rows moved to kd_released_issues) */
byte req[MAXN];                 /* of those, requeued (or settled: never requeued) */
bit cold[MAXN];                 /* K is in the cold table */
byte lhead[MAXN];               /* the ledger chain's head on this branch (a node) */
byte lprev[MAXN];               /* a ledger node: the head before it */
byte rest[MAXN];                /* a restore node: the head it restored */
byte pfrom[MAXN];               /* a fence left a restore pending: the head to restore */
byte ents[MAXN];                /* a ledger node: the entries it applied */
bit inlog[MAXN];                /* its log entry is in Redis */
bit isfence[MAXN];              /* a fence's commit: a new history starts there */
typedef Decisions { byte v[MAXE] };
Decisions dv[MAXN];             /* the decision rows on this branch: a PUT entry's outcome */
byte dw[MAXN];                  /* the decision rows this node wrote (entries) */
byte nn = 1;                    /* next node */
byte srv = 0;                   /* the primary's latest commit */
byte tlstart = 0;               /* the first node of the primary's timeline (promotion) */

/* ---- Redis: the sync record, the hot list, Idempotency-Key records ---- */
byte rec = 0;                   /* the newest stamp recorded (a node) */
byte rhead = 0;                 /* the ledger head that stamp carried */
byte rfrom = 0;                 /* a restore pending: the head to restore (the claim) */
bit halted = 0;                 /* the ledger failed closed */
bit hot = 0;                    /* K is in the hot list */
bit twice = 0;                    /* the duplicate alarm fired */
bit untrusted = 0;              /* Redis lost state: the record must be rebuilt (vouch) */
byte idem[3];                   /* a client's Idempotency-Key record: the issue it replays */

/* ---- keysyncs ---- */
byte ks[3];                      /* IDLE, HOLDING, COMMITTED, TAKEN */
byte ksn[3];                    /* the node it committed */
byte kso[MAXE];                 /* outcomes decided by the batch, until acknowledged */
#ifdef REPLAY_AFTER_NEXT_BATCH
bit old[MAXN];                  /* log entries older than the retention */
#endif

/* ---- clients ---- */
byte hand[3];              /* the issue of K the client was given last (0: none) */
byte hold[3];              /* 1: it holds K; 2: it sent K back, not answered yet */
bit moved[3];              /* K went to another client while its release waited */
byte truth[MAXE];               /* per issue: what an answer said (T_ASSIGNED, T_RELEASED) */

/* ---- budgets ---- */
byte b_pop = POPS;
byte b_put = PUTS;
byte b_pair = PAIRS;
byte b_rep = REPEATS;
byte b_prom = PROMOTIONS;
byte b_crash = CRASHES;
byte b_req = REQUEUES;
byte b_trim = TRIMS;
byte b_rfo = REDIS_FAILOVERS;
byte b_retry = RETRIES;

/* scratch: each action sets what it reads, and clears it all when done (CLEAN), so
 * that it never tells two states apart */
byte t, u, o, i, k, c, m, w, q, e, n;
bit r, ok;
#define CLEAN t = 0; u = 0; o = 0; i = 0; k = 0; c = 0; m = 0; w = 0; q = 0; e = 0; n = 0; r = 0; ok = 0

/* ---------------------------------------------------------------------------------- */

inline newnode() {
  par[nn] = srv; live[nn] = live[srv]; used[nn] = used[srv]; hist[nn] = hist[srv];
  req[nn] = req[srv]; cold[nn] = cold[srv]; lhead[nn] = lhead[srv];
  pfrom[nn] = pfrom[srv];
  t = 1;
  do
  :: t < MAXE -> dv[nn].v[t] = dv[srv].v[t]; t++
  :: t >= MAXE -> break
  od;
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

/* The guard: a guarded write runs only on a primary whose history covers the record. */
#define GUARD_PASSES (!halted && !untrusted)
/* A ledger transaction (and the log's trimming) waits for a pending restore; round 4's
 * did not. */
#ifdef REPLAY_AFTER_NEXT_BATCH
#define NO_RESTORE_PENDING true
#else
#define NO_RESTORE_PENDING (rfrom == 0 && pfrom[srv] == 0)
#endif
/* A ledger transaction decides only on the timeline the record follows: a promoted
 * server adopts its timeline first (a write of its own, recorded), so that a stamp from
 * the old primary landing late either fences it or is refused (SAME_TIMELINE off: round
 * 4's guard, which let a newer timeline pass). */
#ifdef ANY_TIMELINE
#define ON_RECORDS_TIMELINE true
#else
#define ON_RECORDS_TIMELINE (rec >= tlstart)
#endif

/* A new ledger transaction on the primary's latest node: chained, logged before commit. */
inline ledger_node() {
  newnode();
  lprev[srv] = lhead[srv]; lhead[srv] = srv; ents[srv] = 0;
#ifndef LOG_AFTER_COMMIT
  inlog[srv] = 1;
#endif
}

/* Record a stamp (sync_record.lua): a newer commit of the record's history moves it;
 * an older one of the same history (no fence since) leaves it, and is fine; any
 * other is stale (its commit may be lost, or is from before a fence). */
inline record(n, ok) {
  covers(n, rec);
  if
  :: r -> rec = n; rhead = lhead[n]; ok = 1
  :: else ->
     t = rec; ok = 0;
     do
     :: t == n -> ok = 1; break
     :: t != n && (t == 0 || isfence[t]) -> break
     :: t != n && t != 0 && !isfence[t] -> t = par[t]
     od
  fi
}

/* r = 1 when ledger node x is on the primary's ledger chain (the empty start too) */
inline onchain(x) {
  w = lhead[srv]; r = 0;
  do
  :: x == 0 || w == x -> r = 1; break
  :: x != 0 && w != x && w == 0 -> break
  :: x != 0 && w != x && w != 0 -> w = lprev[w]
  od
}

/* Decide entry e on the primary's latest node; o: a PUT's outcome. A PUT decided on
 * this branch already (its decision row is here) gets that outcome again. */
inline decide(e) {
  o = 0;
  if
  :: eop[e] != ISSUE && dv[srv].v[e] != 0 -> o = dv[srv].v[e]
  :: eop[e] != ISSUE && dv[srv].v[e] == 0 -> decide_change(e); dv[srv].v[e] = o; dw[srv] = dw[srv] | bitof(e)
  :: eop[e] == ISSUE -> decide_issue(e)
  fi
}

inline decide_issue(e) {
  if
  :: true ->
     if
     :: live[srv] == e -> skip                                  /* applied again */
     :: live[srv] == 0 && (hist[srv] & bitof(e)) == 0 -> live[srv] = e; used[srv] = 0
     :: live[srv] == 0 && (hist[srv] & bitof(e)) != 0 -> skip   /* released since */
     :: live[srv] != 0 && live[srv] != e ->
        twice = 1                                                 /* issued twice */
#ifndef VARIANT
        ; assert(false)
#endif
     fi
  fi
}

inline decide_change(e) {
  if
  :: live[srv] != 0 && ecli[live[srv]] == ecli[e] && live[srv] < e ->
     if
     :: eop[e] == USE -> used[srv] = 1; o = O_ASSIGNED
     :: eop[e] == REL && !used[srv] ->
        hist[srv] = hist[srv] | bitof(live[srv]); live[srv] = 0; o = O_RELEASED
     :: eop[e] == REL && used[srv] -> o = O_REFUSED
     fi
  :: live[srv] != 0 && ecli[live[srv]] == ecli[e] && live[srv] > e ->
     o = O_REFUSED                                              /* about an earlier issue */
  :: !(live[srv] != 0 && ecli[live[srv]] == ecli[e]) ->
     /* no live row of its own: the latest given-back issue of K, if its own */
     u = 0; t = 1;
     do
     :: t < MAXE -> if :: (hist[srv] & bitof(t)) != 0 -> u = t :: else -> skip fi; t++
     :: t >= MAXE -> break
     od;
     if
     :: u != 0 && ecli[u] == ecli[e] && live[srv] == 0 ->
        if :: eop[e] == REL -> o = O_RELEASED :: else -> o = O_REFUSED fi
     :: else -> o = O_NOTFOUND
     fi
  fi
}

/* What an answer says of issue i must agree with what earlier answers said. */
inline answered(i, o) {
  if
  :: o == O_ASSIGNED -> assert(truth[i] != T_RELEASED); truth[i] = T_ASSIGNED
  :: o == O_RELEASED -> assert(truth[i] != T_ASSIGNED); truth[i] = T_RELEASED
  :: o == O_REFUSED && eop[e] == USE -> assert(truth[i] != T_ASSIGNED); truth[i] = T_RELEASED
  :: o == O_REFUSED && eop[e] == REL -> assert(truth[i] != T_RELEASED); truth[i] = T_ASSIGNED
  :: o == O_NOTFOUND -> assert(o != O_NOTFOUND)   /* the client was given K under issue i */
  fi
}

/* Every entry appended so far is acknowledged: a PUT's wait before it appends. */
#define CAUGHT_UP (nack == ne - 1)
#define REQUEUE_DUE ((hist[srv] & ~req[srv]) != 0)
#define ANYKS(S) (ks[1] == S || (NKS > 1 && ks[2] == S))
#define PICKKS(S) if :: ks[1] == S -> k = 1 :: NKS > 1 && ks[2] == S -> k = 2 fi

/* The ledger may be read (a lookup; docs/api.md): nothing pending, the primary's
 * history is the record's and every commit on it is recorded. Then it must say what
 * the answers said, and name whoever holds K. */
inline readable_checks() {
#ifdef ANSWERS_ONLY
  skip
#else
  if
  :: !halted && rfrom == 0 && pfrom[srv] == 0 && srv == rec ->
     i = 1;
     do
     :: i < MAXE ->
        if
        :: truth[i] == T_ASSIGNED -> assert(live[srv] == i && used[srv])
        :: truth[i] == T_RELEASED -> assert((hist[srv] & bitof(i)) != 0)
        :: else -> skip
        fi;
        i++
     :: i >= MAXE -> break
     od;
     c = 1;
     do
     :: c <= CLIENTS ->
        if
        :: hold[c] == 1 && est[hand[c]] == ACKED -> assert(live[srv] == hand[c])
        :: else -> skip
        fi;
        c++
     :: c > CLIENTS -> break
     od
  :: else -> skip
  fi
#endif
}

/* ---- the restore (one-history design) ------------------------------------------ */

/* Walk the log from the pending head back to where it joins the primary's own chain;
 * r = 1 when every link is there (the restore can be exact). */
inline chain_intact() {
  m = rfrom;
  do
  :: true ->
     onchain(m);
     if
     :: r -> break
     :: !r && !inlog[m] -> break
     :: !r && inlog[m] -> m = lprev[m]
     fi
  od
}

/* Apply what the lost ledger transactions wrote, as they wrote it: K's rows as the
 * newest of them left them, and every decision row they wrote. */
inline restore_images() {
  live[srv] = live[n]; used[srv] = used[n]; hist[srv] = hist[n]; req[srv] = req[n];
  q = n;
  do
  :: true ->
     onchain(q);
     if
     :: r -> break
     :: else ->
        t = 1;
        do
        :: t < MAXE ->
           if :: (dw[q] & bitof(t)) != 0 -> dv[srv].v[t] = dv[q].v[t]; dw[srv] = dw[srv] | bitof(t) :: else -> skip fi;
           t++
        :: t >= MAXE -> break
        od;
        q = lprev[q]
     fi
  od
}

#ifdef REPLAY_REDECIDES
/* round 4: every entry the lost batches applied, decided again: issues first, then
 * the rest, each in stream order */
inline redecide() {
  m = 0; q = rfrom;
  do
  :: true ->
     onchain(q);
     if :: r -> break :: else -> m = m | ents[q]; q = lprev[q] fi
  od;
  i = 1;
  do
  :: i < MAXE -> if :: (m & bitof(i)) != 0 && eop[i] == ISSUE -> decide(i) :: else -> skip fi; i++
  :: i >= MAXE -> break
  od;
  i = 1;
  do
  :: i < MAXE -> if :: (m & bitof(i)) != 0 && eop[i] != ISSUE -> decide(i) :: else -> skip fi; i++
  :: i >= MAXE -> break
  od
}
#endif

/* ---------------------------------------------------------------------------------- */

active proctype protocol() {
  cold[0] = 1;
  do
  /* ---- a dispenser pops K for client c (pop.lua: the pop and its issue entry) ---- */
  :: atomic { b_pop > 0 && hot && ne < MAXE ->
       b_pop--;
       if :: c = CA :: CLIENTS > 1 -> c = CB fi;
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
       hand[c] = ne; hold[c] = 1; moved[c] = 0; idem[c] = ne;
       printf("pop: client %d gets K, issue entry %d\n", c, ne);
       ne++;
       readable_checks();
       CLEAN }

  /* ---- PUT ASSIGNED / UNASSIGNED by a holder, once every earlier entry is applied ---- */
  :: atomic { b_put > 0 && ne < MAXE && CAUGHT_UP && (hold[CA] == 1 || hold[CB % 3] == 1) ->
       if :: hold[CA] == 1 -> c = CA :: CLIENTS > 1 && hold[CB] == 1 -> c = CB fi;
       b_put--;
       if :: eop[ne] = USE :: eop[ne] = REL; hold[c] = 2; idem[c] = 0 fi;
       ecli[ne] = c; eiss[ne] = hand[c]; est[ne] = UNREAD;
       printf("put: client %d entry %d op %d (2 assign, 3 unassign)\n", c, ne, eop[ne]);
       ne++;
       CLEAN }

  /* ---- both at once (sent together: both waited, then both were appended) ---- */
  :: atomic { b_pair > 0 && ne + 1 < MAXE && hold[CA] == 1 && CAUGHT_UP ->
       b_pair--;
       hold[CA] = 2; idem[CA] = 0;
       if :: eop[ne] = USE; eop[ne + 1] = REL :: eop[ne] = REL; eop[ne + 1] = USE fi;
       ecli[ne] = CA; eiss[ne] = hand[CA]; est[ne] = UNREAD;
       ecli[ne + 1] = CA; eiss[ne + 1] = hand[CA]; est[ne + 1] = UNREAD;
       printf("pair: entries %d op %d, %d op %d\n", ne, eop[ne], ne + 1, eop[ne + 1]);
       ne = ne + 2;
       CLEAN }

  /* ---- a client asks again what it was answered (the same status, same issue) ---- */
  :: atomic { b_rep > 0 && ne < MAXE && hold[CA] == 1 && CAUGHT_UP ->
       e = 0; t = 1;
       do
       :: t < ne -> if :: eop[t] != ISSUE && eans[t] && eiss[t] == hand[CA] -> e = t :: else -> skip fi; t++
       :: t >= ne -> break
       od;
       if
       :: e != 0 ->
          b_rep--;
          if :: eop[e] == REL -> hold[CA] = 2; idem[CA] = 0 :: else -> skip fi;
          eop[ne] = eop[e]; ecli[ne] = CA; eiss[ne] = hand[CA]; est[ne] = UNREAD;
          printf("repeat: entry %d repeats %d\n", ne, e);
          ne++
       :: else -> skip
       fi;
       CLEAN }

  /* ---- a PUT is answered: the outcome recorded for its entry ---- */
  :: atomic { true ->
       e = 1;
       do
       :: e < ne && (eop[e] == ISSUE || eans[e] || outc[e] == 0) -> e++
       :: e < ne && eop[e] != ISSUE && !eans[e] && outc[e] != 0 -> break
       :: e >= ne -> break
       od;
       if
       :: e < ne ->
          eans[e] = 1;
          printf("answer: entry %d outcome %d (1 assigned 2 released 3 refused 4 notfound)\n", e, outc[e]);
          answered(eiss[e], outc[e]);
          c = ecli[e];
          if
          :: eop[e] == REL && hold[c] == 2 && eiss[e] == hand[c] && outc[e] == O_RELEASED -> hold[c] = 0
          :: eop[e] == REL && hold[c] == 2 && eiss[e] == hand[c] && outc[e] != O_RELEASED ->
             assert(!moved[c]); hold[c] = 1          /* still its: nobody else may have it */
          :: else -> skip
          fi;
          readable_checks()
       :: else -> skip
       fi;
       CLEAN }

  /* ---- a keysync reads a batch: the oldest unread entries, one or two ---- */
  :: atomic { ANYKS(IDLE) ->
       PICKKS(IDLE);
       e = 1;
       do
       :: e < ne && est[e] != UNREAD -> e++
       :: e < ne && est[e] == UNREAD -> break
       :: e >= ne -> break
       od;
       if
       :: e < ne ->
          est[e] = 2 + k;
          if
          :: e + 1 < ne && est[e + 1] == UNREAD -> est[e + 1] = 2 + k
          :: true -> skip
          fi;
          ks[k] = HOLDING;
          printf("read: keysync %d from entry %d\n", k, e)
       :: else -> skip
       fi;
       CLEAN }

  /* ---- it applies the batch in one guarded transaction (logged before it commits) ---- */
  :: atomic { ANYKS(HOLDING) && GUARD_PASSES && nn < MAXN && NO_RESTORE_PENDING && ON_RECORDS_TIMELINE ->
       PICKKS(HOLDING);
       covers(srv, rec);
       if
       :: r ->                                    /* else the guard refuses: fence first */
          ledger_node();
          e = 1;
          do
          :: e < ne ->
             if :: est[e] == 2 + k -> decide(e); kso[e] = o; ents[srv] = ents[srv] | bitof(e) :: else -> skip fi;
             e++
          :: e >= ne -> break
          od;
          ks[k] = COMMITTED; ksn[k] = srv;
          printf("commit: keysync %d node %d (live %d used %d hist %d)\n", k, srv, live[srv], used[srv], hist[srv])
       :: else -> skip
       fi;
       CLEAN }

  /* ---- its acknowledgement: the stamp recorded, the outcomes, the entries acked ---- */
  :: atomic { ANYKS(COMMITTED) ->
       PICKKS(COMMITTED);
       n = ksn[k];
       record(n, ok);
       printf("ack: keysync %d node %d recorded %d\n", k, n, ok);
       if
       :: ok ->
#ifdef LOG_AFTER_COMMIT
          inlog[n] = 1;
#endif
          if :: rest[n] != 0 && rfrom == rest[n] -> rfrom = 0 :: else -> skip fi;
          e = 1;
          do
          :: e < ne ->
             if
             :: est[e] == 2 + k ->
                est[e] = ACKED; nack++;
                if :: eop[e] != ISSUE && outc[e] == 0 -> outc[e] = kso[e] :: else -> skip fi
             :: else -> skip
             fi;
             e++
          :: e >= ne -> break
          od
#ifdef REPLAY_AFTER_NEXT_BATCH
          ;
          /* round 4: the acknowledgement trims old copies; the restore comes after */
          t = 1;
          do
          :: t < MAXN -> if :: old[t] -> inlog[t] = 0 :: else -> skip fi; t++
          :: t >= MAXN -> break
          od
#endif
       :: else ->
          /* refused (the record follows another history): the batch stays pending */
          e = 1;
          do
          :: e < ne -> if :: est[e] == 2 + k -> est[e] = UNREAD :: else -> skip fi; e++
          :: e >= ne -> break
          od
       fi;
       ks[k] = IDLE;
       readable_checks();
       CLEAN }

  /* ---- a keysync dies: what it held is claimed by another (or itself, restarted) ---- */
  :: atomic { b_crash > 0 && (ks[1] != IDLE || (NKS > 1 && ks[2] != IDLE)) ->
       if :: ks[1] != IDLE -> k = 1 :: NKS > 1 && ks[2] != IDLE -> k = 2 fi;
       b_crash--;
       printf("crash: keysync %d\n", k);
       e = 1;
       do
       :: e < ne -> if :: est[e] == 2 + k -> est[e] = UNREAD :: else -> skip fi; e++
       :: e >= ne -> break
       od;
       ks[k] = IDLE;
       CLEAN }

  /* ---- keysync takes K from the cold table (a guarded take), then pushes it ---- */
  :: atomic { cold[srv] && GUARD_PASSES && nn < MAXN && ANYKS(IDLE) ->
       PICKKS(IDLE);
       covers(srv, rec);
       if
       :: r -> newnode(); cold[srv] = 0; ks[k] = TAKEN; ksn[k] = srv; printf("take: node %d\n", srv)
       :: else -> skip
       fi;
       CLEAN }
  :: atomic { ANYKS(TAKEN) ->
       PICKKS(TAKEN);
       record(ksn[k], ok);
       if :: ok -> hot = 1 :: else -> skip fi;      /* else the batch is lost, never pushed */
       printf("push: recorded %d\n", ok);
       ks[k] = IDLE;
       readable_checks();
       CLEAN }

  /* ---- a release older than reissue_after_s goes back to the cold table ---- */
  :: atomic { b_req > 0 && REQUEUE_DUE && GUARD_PASSES && nn < MAXN && ANYKS(IDLE) && NO_RESTORE_PENDING && ON_RECORDS_TIMELINE ->
       PICKKS(IDLE);
       covers(srv, rec);
       if
       :: r ->
          b_req--;
          ledger_node();
          if :: live[srv] == 0 -> cold[srv] = 1 :: else -> skip fi;   /* never a live key */
          req[srv] = hist[srv];
          ks[k] = COMMITTED; ksn[k] = srv;
          printf("requeue: node %d cold %d\n", srv, cold[srv])
       :: else -> skip
       fi;
       CLEAN }

  /* ---- a promoted server's history covers the record: it adopts its timeline ---- */
  :: atomic { !ON_RECORDS_TIMELINE && GUARD_PASSES && nn < MAXN && ANYKS(IDLE) ->
       PICKKS(IDLE);
       covers(srv, rec);
       if
       :: r -> newnode(); ks[k] = ADOPTING; ksn[k] = srv; printf("adopt: node %d\n", srv)
       :: else -> skip
       fi;
       CLEAN }
  :: atomic { ANYKS(ADOPTING) ->
       PICKKS(ADOPTING);
       record(ksn[k], ok);                          /* else a late stamp came first: fence */
       ks[k] = IDLE;
       CLEAN }

  /* ---- the fence: a guarded write found the primary's history behind the record ---- */
  :: atomic { GUARD_PASSES && nn < MAXN ->
       covers(srv, rec);
       if
       :: !r ->
          newnode();
          isfence[srv] = 1;
          cold[srv] = 0;                             /* discarded, never reissued */
#ifdef REPLAY_REDECIDES
          req[srv] = hist[srv];                      /* round 4: settle every release */
#endif
          /* the claim: the record follows this history now; the head to restore is
           * kept in the record and in the fence's own commit */
          if :: rfrom == 0 -> rfrom = rhead :: else -> skip fi;
          pfrom[srv] = rfrom;
          onchain(rfrom);
          if :: r -> rfrom = 0; pfrom[srv] = 0 :: else -> skip fi;
          rec = srv; rhead = lhead[srv];
          printf("fence: node %d restore from %d\n", srv, rfrom)
       :: else -> skip
       fi;
       CLEAN }

#ifndef REPLAY_AFTER_NEXT_BATCH
  /* ---- the restore: keysync applies what the lost ledger transactions wrote ---- */
  :: atomic { (rfrom != 0 || pfrom[srv] != 0) && GUARD_PASSES && nn < MAXN && ANYKS(IDLE) ->
       PICKKS(IDLE);
       covers(srv, rec);
       if
       :: r ->
          if :: rfrom == 0 -> rfrom = pfrom[srv] :: else -> skip fi;
          if
          :: rest[lhead[srv]] == rfrom ->
             /* restored already, its acknowledgement lost: a stamp confirms it */
             rec = srv; rhead = lhead[srv]; rfrom = 0
          :: else ->
             chain_intact();
             if
             :: !r ->
                /* a link is gone: fail closed. Only a trimmed or lost log entry may do
                 * this (a log written before each commit has every link otherwise) */
                assert(b_trim < TRIMS || b_rfo < REDIS_FAILOVERS);
                halted = 1; printf("halt\n")
             :: r ->
                n = rfrom;
                ledger_node();
#ifdef REPLAY_REDECIDES
                redecide();
#else
                restore_images();
#endif
                rest[srv] = n; pfrom[srv] = 0;
                ks[k] = COMMITTED; ksn[k] = srv;
                printf("restore: node %d from %d (live %d used %d hist %d)\n", srv, n, live[srv], used[srv], hist[srv])
             fi
          fi
       :: else -> skip
       fi;
       CLEAN }
#else
  /* ---- round 4: the restore runs after a batch was acknowledged (and trimmed) ---- */
  :: atomic { (rfrom != 0 || pfrom[srv] != 0) && GUARD_PASSES && nn < MAXN && ks[1] == IDLE && nack > 0 ->
       covers(srv, rec);
       if
       :: r ->
          if :: rfrom == 0 -> rfrom = pfrom[srv] :: else -> skip fi;
          chain_intact();
          if
          :: !r -> rfrom = 0; pfrom[srv] = 0; rhead = lhead[srv]   /* nothing kept: none */
          :: r ->
             n = rfrom;
             ledger_node();
             restore_images();
             rest[srv] = n; pfrom[srv] = 0;
             ks[1] = COMMITTED; ksn[1] = srv
          fi
       :: else -> skip
       fi;
       CLEAN }
#endif

  /* ---- time passes: the log's oldest entry is trimmed (never while a restore waits) ---- */
  :: atomic { b_trim > 0 && NO_RESTORE_PENDING ->
       t = 1;
       do
       :: t < MAXN && !inlog[t] -> t++
       :: t < MAXN && inlog[t] -> break
       :: t >= MAXN -> break
       od;
       if
       :: t < MAXN ->
          b_trim--;
#ifdef REPLAY_AFTER_NEXT_BATCH
          u = 1;
          do
          :: u < MAXN -> if :: inlog[u] -> old[u] = 1 :: else -> skip fi; u++
          :: u >= MAXN -> break
          od
#else
          inlog[t] = 0
#endif
       :: else -> skip
       fi;
       CLEAN }

  /* ---- a client retries its pop with the same Idempotency-Key: the same answer ---- */
  :: atomic { b_retry > 0 && (idem[CA] != 0 || (CLIENTS > 1 && idem[CB] != 0)) ->
       b_retry--;
       if :: idem[CA] != 0 -> c = CA :: CLIENTS > 1 && idem[CB] != 0 -> c = CB fi;
       assert(hold[c] == 1 && hand[c] == idem[c]);   /* never a key it gave back */
       printf("retry: client %d replayed issue %d\n", c, idem[c]);
       CLEAN }

  /* ---- a Redis failover: the replica lacked the newest writes ---- */
  :: atomic { b_rfo > 0 ->
       b_rfo--;
       hot = 0;                                      /* the fence discards the hot list */
       idem[CA] = 0; idem[CB % 3] = 0;               /* records older than the fence: never replayed */
       /* the log's newest entry had not reached the replica */
       t = MAXN - 1;
       do
       :: t > 0 && !inlog[t] -> t--
       :: t > 0 && inlog[t] -> inlog[t] = 0; break
       :: t > 0 && inlog[t] -> break                 /* or it had */
       :: t == 0 -> break
       od;
       untrusted = 1;                                /* the record may have lost updates */
       printf("redis failover\n");
       CLEAN }

  /* ---- the first guarded write after it rebuilds the record from PostgreSQL ---- */
  :: atomic { untrusted && !halted && nn < MAXN ->
       if
       :: srv >= tlstart || tlstart == 0 ->
          /* PostgreSQL has not forked since its last guarded write: it vouches */
          rec = srv; rhead = lhead[srv]; rfrom = pfrom[srv]; untrusted = 0;
          printf("vouch: node %d\n", srv)
       :: else -> halted = 1; printf("halt: both tiers lost state\n")
       fi;
       CLEAN }

  /* ---- a PostgreSQL promotion: the replica had replayed up to an ancestor ---- */
  :: atomic { b_prom > 0 && srv != 0 ->
       b_prom--;
       t = par[srv];
       do
       :: t != 0 -> t = par[t]
       :: true -> break
       od;
       srv = t; tlstart = nn;
       printf("promotion: the primary is now node %d\n", srv);
       CLEAN }
  od
}

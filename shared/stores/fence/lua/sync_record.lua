-- Helper: the Redis side of the PostgreSQL fence. Prepended to fenced scripts.
-- Every range lease and keysync batch advances a clock in PostgreSQL, in the same
-- statement; its stamp {database, timeline, fork, clock} is recorded here after commit,
-- before any key of it can reach a hot list. A PostgreSQL whose history does not cover
-- this record has lost commits (the guard in sql.py refuses to run on it).
-- Fields: database (the one this namespace is bound to), timeline, fork, clock (the
-- history the record follows: a timeline, and the clock value that history started
-- from on it); head (the ledger link the newest stamp named: this key group's lane);
-- leased:<type> (highest counter ever leased); untrusted (set by the fence on a new
-- Redis server: rebuilt by a vouch); fence_needed; halted; restore_from (the
-- restore target: the ledger link keysync must restore a fenced server up to; stored
-- under its first name, kept so that a rolling update or a rollback reads it); ledger_halt (why the ledger failed
-- closed).
--
-- record_stamp returns 'ok', or why the caller must not push or use what the stamp
-- covers: 'stale' (it proves, or may hide, lost commits, or comes from another history:
-- an older timeline, another server on the same timeline, or from before a fence),
-- 'untrusted' (the record must be rebuilt first: vouch, then try again), 'foreign'
-- (another database) or 'halted'. The record never moves to an older timeline.
local function record_stamp(database, timeline, fork, clock, head)
  local rec = redis.call('HMGET', SYNC_RECORD, 'timeline', 'fork', 'clock', 'untrusted',
                         'halted', 'database')
  local tl, rfork, rclock = tonumber(rec[1]) or 0, tonumber(rec[2]) or 0, tonumber(rec[3]) or 0
  if rec[5] == '1' then
    return 'halted'
  end
  if rec[6] and rec[6] ~= database then
    return 'foreign'
  end
  if rec[4] == '1' or tl == 0 then
    return 'untrusted'
  end
  if timeline == tl then
    if fork ~= rfork then
      return 'stale'
    end
    if clock > rclock then
      redis.call('HSET', SYNC_RECORD, 'clock', clock, 'head', head)
    end
    return 'ok'
  end
  if timeline > tl then
    if rclock > fork then
      -- A newer timeline that forked before the last recorded commit: commits lost.
      redis.call('HSET', SYNC_RECORD, 'fence_needed', '1')
      return 'stale'
    end
    redis.call('HSET', SYNC_RECORD, 'timeline', timeline, 'fork', fork, 'clock', clock,
               'head', head)
    return 'ok'
  end
  -- A straggler from an older timeline, after a newer one has written (a superseded
  -- primary still taking writes): refused. Everything recorded before the newer
  -- timeline took over is in its history, so nothing needs fencing.
  return 'stale'
end

-- Raise leased:<type> fields to the given highs (never lowers one). Pairs start at
-- ARGV[first]: field, value, field, value, ...
local function raise_leased(first)
  for i = first, #ARGV, 2 do
    local known = tonumber(redis.call('HGET', SYNC_RECORD, ARGV[i])) or 0
    if tonumber(ARGV[i + 1]) > known then
      redis.call('HSET', SYNC_RECORD, ARGV[i], ARGV[i + 1])
    end
  end
end

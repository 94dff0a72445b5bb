-- Helper: the Redis side of the PostgreSQL fence. Prepended to fenced scripts.
-- Every range lease and keysync batch advances a clock in PostgreSQL, in the same
-- statement; its stamp {timeline, fork, clock} is recorded here after commit, before
-- any key of it can reach a hot list. A PostgreSQL whose history does not cover this
-- record has lost commits (the guard in sql.py refuses to run on it).
-- Fields: timeline, fork, clock; leased:<type> (highest counter ever leased);
-- untrusted (set by the fence on a new Redis server); fence_needed; halted.
--
-- Returns 'ok', or 'stale' when the stamp proves (or may hide) lost commits: the
-- caller must not push or use what the stamp covers.
local function record_stamp(timeline, fork, clock)
  local rec = redis.call('HMGET', SYNC_RECORD, 'timeline', 'fork', 'clock', 'untrusted', 'halted')
  local tl, rfork, rclock = tonumber(rec[1]) or 0, tonumber(rec[2]) or 0, tonumber(rec[3]) or 0
  if rec[5] == '1' then
    return 'stale'
  end
  if rec[4] == '1' or tl == 0 or timeline > tl then
    if rec[4] ~= '1' and tl ~= 0 and rclock > fork then
      -- A newer timeline that forked before the last recorded commit: commits lost.
      redis.call('HSET', SYNC_RECORD, 'fence_needed', '1')
      return 'stale'
    end
    redis.call('HSET', SYNC_RECORD, 'timeline', timeline, 'fork', fork, 'clock', clock)
    redis.call('HDEL', SYNC_RECORD, 'untrusted')
    return 'ok'
  end
  if timeline == tl then
    if clock > rclock then
      redis.call('HSET', SYNC_RECORD, 'clock', clock)
    end
    return 'ok'
  end
  -- A straggler from an older timeline, after the newer one has written: refused. Its
  -- commit is lost on the newer timeline if it came after that timeline's fork.
  if clock > rfork then
    redis.call('HSET', SYNC_RECORD, 'fence_needed', '1')
  end
  return 'stale'
end

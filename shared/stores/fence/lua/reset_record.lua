-- A PostgreSQL fence claims the record for its server, before the fence commits (the
-- fence holds the clock row's lock; see postgres_fence.py): the record restarts from
-- the fenced server's stamp, a new history (its fork). Clears untrusted, fence_needed
-- and halted; raises every leased:<type> to the floors the fence moved its sequences
-- past (a record that lost some gets them back); keeps higher ones.
-- Refused, with nothing changed, when the fence's view is out of date: 'foreign' (the
-- namespace is bound to another database), 'superseded' (the record already follows a
-- newer timeline: this server must not write), 'moved' (a lease was recorded above a
-- floor the fence moved its sequences to since it read the record, or, for a fence
-- the process decided on, the record turned untrusted or halted meanwhile: Redis lost
-- state during the fence; read again). An operator's take-over ignores database and
-- timeline: they assert this server is the one from now on.
-- With several key groups the claim is pending (claim_fences: the fence count it
-- expects) until settle sees the fence committed (confirm_record.lua).
-- The ledger: the claim is also refused 'moved' when the record's head moved since the
-- fence read it (a ledger transaction of the old primary recorded meanwhile: read
-- again, so that the restore covers it); the restore target (stored as restore_from)
-- is set to the head the fence found this server lacks, unless a restore is pending
-- already (its target covers more: nothing was restored since), and head becomes this
-- server's.
-- An adoption ('adopt': a promoted server whose history covers the record takes up its
-- new timeline, nothing fenced) is refused 'moved' when any stamp was recorded since the
-- fence read the record: the old primary's late commit may be one this server lacks.
-- Returns {status, discarded}; status 'ok' when claimed.
local database = ARGV[1]
local timeline, fork, clock = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local head = ARGV[5]              -- the fenced server's ledger head of this lane
local mode = ARGV[6]              -- 'automatic' | 'operator' | 'take_over'
local pending = ARGV[7]           -- the fence count a pending claim expects ('0': none)
local seen_head = ARGV[8]         -- the record's head when the fence read it
local restore_to = ARGV[9]        -- the link to restore up to ('': none)
local seen_at = ARGV[10]          -- 'timeline/fork/clock' as the fence read it
local FIRST_FLOOR = 11            -- ARGV[11..]: leased:<type>, floor the fence used, ...

local discarded = enforce_fence()
local rec = redis.call('HMGET', SYNC_RECORD, 'database', 'timeline', 'untrusted', 'halted',
                       'head', 'restore_from', 'fork', 'clock')
if mode ~= 'take_over' then
  if rec[1] and rec[1] ~= database then
    return {'foreign', discarded}
  end
  if (tonumber(rec[2]) or 0) > timeline then
    return {'superseded', discarded}
  end
end
local automatic = mode == 'automatic' or mode == 'adopt'
if automatic and (rec[3] == '1' or rec[4] == '1' or (rec[5] or '') ~= seen_head) then
  return {'moved', discarded}
end
local at = (rec[2] or '0') .. '/' .. (rec[7] or '0') .. '/' .. (rec[8] or '0')
if mode == 'adopt' and at ~= seen_at then
  return {'moved', discarded}
end
local floors = {}
for i = FIRST_FLOOR, #ARGV, 2 do
  floors[ARGV[i]] = tonumber(ARGV[i + 1])
end
local fields = redis.call('HGETALL', SYNC_RECORD)
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 7) == 'leased:' and tonumber(fields[i + 1]) > (floors[fields[i]] or 0) then
    return {'moved', discarded}
  end
end
raise_leased(FIRST_FLOOR)
redis.call('HSET', SYNC_RECORD, 'database', database, 'timeline', timeline, 'fork', fork,
           'clock', clock, 'head', head)
redis.call('HDEL', SYNC_RECORD, 'untrusted', 'fence_needed', 'halted', 'halt_reason')
if restore_to ~= '' and (rec[6] or '') == '' then
  redis.call('HSET', SYNC_RECORD, 'restore_from', restore_to)
end
if pending ~= '0' then
  redis.call('HSET', SYNC_RECORD, 'claim_fences', pending)
else
  redis.call('HDEL', SYNC_RECORD, 'claim_fences')
end
return {'ok', discarded}

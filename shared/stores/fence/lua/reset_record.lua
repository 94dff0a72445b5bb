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
-- Returns {status, discarded}; status 'ok' when claimed.
local database = ARGV[1]
local timeline, fork, clock = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local mode = ARGV[5]              -- 'automatic' | 'operator' | 'take_over'
local pending = ARGV[6]           -- the fence count a pending claim expects ('0': none)
local FIRST_FLOOR = 7             -- ARGV[7..]: leased:<type>, floor the fence used, ...

local discarded = enforce_fence()
local rec = redis.call('HMGET', SYNC_RECORD, 'database', 'timeline', 'untrusted', 'halted')
if mode ~= 'take_over' then
  if rec[1] and rec[1] ~= database then
    return {'foreign', discarded}
  end
  if (tonumber(rec[2]) or 0) > timeline then
    return {'superseded', discarded}
  end
end
if mode == 'automatic' and (rec[3] == '1' or rec[4] == '1') then
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
           'clock', clock)
redis.call('HDEL', SYNC_RECORD, 'untrusted', 'fence_needed', 'halted', 'halt_reason')
if pending ~= '0' then
  redis.call('HSET', SYNC_RECORD, 'claim_fences', pending)
else
  redis.call('HDEL', SYNC_RECORD, 'claim_fences')
end
return {'ok', discarded}

-- A PostgreSQL fence claims the record for its server, before the fence commits (the
-- fence holds the clock row's lock; see postgres_fence.py): the record restarts from
-- the fenced server's stamp, a new history (its fork). Clears untrusted, fence_needed
-- and halted; keeps every leased:<type>.
-- Refused, with nothing changed, when the fence's view is out of date: 'foreign' (the
-- namespace is bound to another database), 'superseded' (the record already follows a
-- newer timeline: this server must not write), 'moved' (a lease was recorded above a
-- floor the fence moved its sequences to, since it read the record: read again).
-- Returns {status, discarded}; status 'ok' when claimed.
local database = ARGV[1]
local timeline, fork, clock = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local FIRST_FLOOR = 5             -- ARGV[5..]: leased:<type>, floor the fence used, ...

local discarded = enforce_fence()
local rec = redis.call('HMGET', SYNC_RECORD, 'database', 'timeline')
if rec[1] and rec[1] ~= database then
  return {'foreign', discarded}
end
if (tonumber(rec[2]) or 0) > timeline then
  return {'superseded', discarded}
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
redis.call('HSET', SYNC_RECORD, 'database', database, 'timeline', timeline, 'fork', fork,
           'clock', clock)
redis.call('HDEL', SYNC_RECORD, 'untrusted', 'fence_needed', 'halted', 'halt_reason')
return {'ok', discarded}

-- After a PostgreSQL fence: the record restarts from the fenced server's stamp.
-- Clears untrusted, fence_needed and halted; keeps every leased:<type> (the highest
-- counters ever leased never go down), and keeps a higher clock that a guarded write
-- on the same timeline recorded while the fence committed.
local timeline, fork, clock = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local discarded = enforce_fence()
local rec = redis.call('HMGET', SYNC_RECORD, 'timeline', 'clock')
if tonumber(rec[1]) == timeline and (tonumber(rec[2]) or 0) > clock then
  clock = tonumber(rec[2])
end
redis.call('HSET', SYNC_RECORD, 'timeline', timeline, 'fork', fork, 'clock', clock)
redis.call('HDEL', SYNC_RECORD, 'untrusted', 'fence_needed', 'halted')
return discarded

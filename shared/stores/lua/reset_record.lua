-- After a PostgreSQL fence: the record restarts from the fenced server's stamp.
-- Clears untrusted, fence_needed and halted; keeps every leased:<type> (the highest
-- counters ever leased never go down).
local timeline, fork, clock = ARGV[1], ARGV[2], ARGV[3]

local discarded = enforce_fence()
redis.call('HSET', SYNC_RECORD, 'timeline', timeline, 'fork', fork, 'clock', clock)
redis.call('HDEL', SYNC_RECORD, 'untrusted', 'fence_needed', 'halted')
return discarded

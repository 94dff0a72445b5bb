-- Both tiers lost state in the same window: no automatic fence can be proven safe.
-- Guarded writes stop until an operator runs `keydispenser fence-postgres`.
local reason = ARGV[1]

local discarded = enforce_fence()
redis.call('HSET', SYNC_RECORD, 'halted', '1', 'halt_reason', reason)
return discarded

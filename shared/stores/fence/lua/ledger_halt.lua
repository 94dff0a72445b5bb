-- The ledger fails closed (ARGV[1]: why), or an operator resumes it ('' : the halt and
-- any pending restore are cleared: what the ledger log could not restore is accepted
-- as lost). Keys are still served either way; only the ledger waits.
-- Returns {'ok', discarded}.
local reason = ARGV[1]

local discarded = enforce_fence()
if reason ~= '' then
  redis.call('HSET', SYNC_RECORD, 'ledger_halt', reason)
else
  redis.call('HDEL', SYNC_RECORD, 'ledger_halt', 'restore_from')
end
return {'ok', discarded}

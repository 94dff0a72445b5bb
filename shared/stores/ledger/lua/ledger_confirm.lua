-- A ledger transaction committed: record its stamp (sync_record.lua's record_stamp,
-- which names the transaction's link as the ledger's head), publish the outcome of each
-- status change it decided (once: the first stays), acknowledge and delete the entries
-- it applied, and trim the ledger log to its retention, but never while a restore is
-- pending (the restore still needs what it holds). A restore's link also clears the
-- pending restore it completed. Last, a short entry on the confirmed stream wakes every
-- client blocked on it (a PUT waiting for its outcome, or for keysync to catch up).
-- Returns {status, acknowledged}: 'ok', or record_stamp's refusal ('stale',
-- 'untrusted', 'foreign', 'halted'; nothing else done: the entries stay pending).
local stream = KEYS[5]
local log = KEYS[6]
local confirmed = KEYS[7]         -- redis_keys.ledger_confirmed_key
local group = ARGV[1]
local retain_ms = tonumber(ARGV[2])
local outcome_prefix = ARGV[3]    -- redis_keys.ledger_outcome_key(namespace, '')
local outcome_ttl = tonumber(ARGV[4])  -- seconds an outcome is kept for its client
local confirmed_kept = ARGV[5]    -- entries the confirmed stream keeps
local database = ARGV[6]
local timeline, fork, clock = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local head = ARGV[10]             -- the transaction's own link
local restored = ARGV[11]         -- the pending restore this link completes ('': none)
local n_outcomes = tonumber(ARGV[12])
local FIRST = 13                  -- ARGV[13..]: entry, outcome pairs, then entries to ack

enforce_fence()
local status = record_stamp(database, timeline, fork, clock, head)
if status ~= 'ok' then
  return {status, 0}
end
if restored ~= '' and redis.call('HGET', SYNC_RECORD, 'restore_from') == restored then
  redis.call('HDEL', SYNC_RECORD, 'restore_from')
end
local i = FIRST
for _ = 1, n_outcomes do
  redis.call('SET', outcome_prefix .. ARGV[i], ARGV[i + 1], 'NX', 'EX', outcome_ttl)
  i = i + 2
end
local acked = 0
for j = i, #ARGV do
  acked = acked + redis.call('XACK', stream, group, ARGV[j])
  redis.call('XDEL', stream, ARGV[j])
end
if redis.call('HEXISTS', SYNC_RECORD, 'restore_from') == 0 then
  local now = redis.call('TIME')
  local oldest = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - retain_ms
  redis.call('XTRIM', log, 'MINID', '~', string.format('%d', math.max(oldest, 0)))
end
redis.call('XADD', confirmed, 'MAXLEN', confirmed_kept, '*', 'acked', acked)
return {'ok', acked}

-- A ledger transaction committed: record its stamp (sync_record.lua's record_stamp,
-- which names the transaction's link as the ledger's head), clear the restore pending,
-- publish the outcome of each status change it decided (once: the first stays),
-- acknowledge and delete the entries it applied, and trim the ledger log to its
-- retention. Last, a short entry on the confirmed stream wakes every client blocked on
-- it (a PUT waiting for its outcome, or for keysync to catch up).
--
-- A stamp the record accepts is on the fenced server's history, where the guard
-- (GUARD_LEDGER) passed nothing before the pending restore: this link is that restore
-- or follows it. So the restore is done, and a later fence restores up to this link
-- (the record's head), which the restore's own link precedes; a restore_from kept until
-- the restore's own confirmation would make that fence restore only up to the older
-- target and lose what followed it (the model's two-keysync world with a second
-- promotion). Nothing is done for a refused stamp: a stale confirmation, an old primary's
-- still running, neither trims nor clears.
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
local n_outcomes = tonumber(ARGV[11])
local FIRST = 12                  -- ARGV[12..]: entry, outcome pairs, then entries to ack

enforce_fence()
local status = record_stamp(database, timeline, fork, clock, head)
if status ~= 'ok' then
  return {status, 0}
end
redis.call('HDEL', SYNC_RECORD, 'restore_from')
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
local now = redis.call('TIME')
local oldest = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - retain_ms
redis.call('XTRIM', log, 'MINID', '~', string.format('%d', math.max(oldest, 0)))
redis.call('XADD', confirmed, 'MAXLEN', confirmed_kept, '*', 'acked', acked)
return {'ok', acked}

-- Take up to `count` keys once per idempotency key, behind the fence.
-- Returns {status, keys, remaining, exhausted, discarded, refill}; status is 'taken',
-- 'replayed' (the keys of the first request with this idempotency key) or
-- 'mismatch' (the key was used for another type or count). Scripts run one at a
-- time, so concurrent retries see the first one's record: no lock is needed.
local hot_list = KEYS[5]
local exhausted_marker = KEYS[6]
local ledger_stream = KEYS[7]
local refill_stats = KEYS[8]
local record_key = KEYS[9]        -- the idempotency record
local count = tonumber(ARGV[1])
local ledger_type = ARGV[2]       -- the type's name when it keeps a ledger, else ''
local client = ARGV[3]            -- API client name (the record belongs to it)
local record_ttl = tonumber(ARGV[4])
local request = ARGV[5]           -- fingerprint of the request (client, type and count)
local idempotency_key = ARGV[6]   -- as the client sent it, for the ledger
-- '1' for a ledger type: a record made before this server owned the fence (inherited
-- through a failover, or brought back by a restart from an older snapshot, where the
-- release that forgot it is lost) may name a key given back, and issued to another
-- client since: it is never replayed (the retry is answered afresh; the first keys
-- stay in the ledger under the client).
local owned_only = ARGV[7] == '1'

local discarded, owner = enforce_fence()
local saved = redis.call('GET', record_key)
if saved then
  local record = cjson.decode(saved)
  -- Another client's record never replays (its key name differs too).
  if record.request ~= request or record.client ~= client then
    return {'mismatch', {}, 0, 0, discarded, {}}
  end
  if not owned_only or record.owner == owner then
    return {'replayed', record.keys, redis.call('LLEN', hot_list), 0, discarded, {}}
  end
  redis.call('DEL', record_key)  -- answered afresh below
end
local taken = redis.call('LPOP', hot_list, count)
if not taken then
  local refill = redis.call('HMGET', refill_stats, 'rate', 'at')
  return {'taken', {}, 0, redis.call('EXISTS', exhausted_marker), discarded, refill}
end
local record = {request = request, client = client, keys = taken, owner = owner}
redis.call('SET', record_key, cjson.encode(record), 'EX', record_ttl)
if ledger_type ~= '' then
  ledger_issue(ledger_stream, ledger_type, taken, {client}, idempotency_key)
end
return {'taken', taken, redis.call('LLEN', hot_list), 0, discarded, {}}

-- Take up to ARGV[1] keys once per idempotency key, behind the fence.
-- KEYS[4]: hot list. KEYS[5]: the type's exhausted marker. KEYS[6]: ledger stream.
-- KEYS[7]: refill statistics. KEYS[8]: idempotency record.
-- ARGV[1]: count. ARGV[2]: id type when the type keeps a ledger, else ''. ARGV[3]: API
-- client. ARGV[4]: record TTL (s). ARGV[5]: request fingerprint (type and count).
-- ARGV[6]: the client's idempotency key (for the ledger).
-- Returns {status, keys, remaining, exhausted, discarded, refill}; status is 'taken',
-- 'replayed' (the keys of the first request with this idempotency key) or
-- 'mismatch' (the key was used for another type or count). Scripts run one at a
-- time, so concurrent retries see the first one's record: no lock is needed.
local discarded = enforce_fence()
local saved = redis.call('GET', KEYS[8])
if saved then
  local record = cjson.decode(saved)
  if record.request ~= ARGV[5] then
    return {'mismatch', {}, 0, 0, discarded, {}}
  end
  return {'replayed', record.keys, redis.call('LLEN', KEYS[4]), 0, discarded, {}}
end
local taken = redis.call('LPOP', KEYS[4], tonumber(ARGV[1]))
if not taken then
  local refill = redis.call('HMGET', KEYS[7], 'rate', 'at')
  return {'taken', {}, 0, redis.call('EXISTS', KEYS[5]), discarded, refill}
end
redis.call('SET', KEYS[8], cjson.encode({request = ARGV[5], keys = taken}), 'EX', tonumber(ARGV[4]))
if ARGV[2] ~= '' then
  ledger_issue(KEYS[6], ARGV[2], taken, {ARGV[3]}, ARGV[6])
end
return {'taken', taken, redis.call('LLEN', KEYS[4]), 0, discarded, {}}

-- Take up to ARGV[1] keys once per idempotency key, behind the fence.
-- KEYS[4]: hot list. KEYS[5]: the type's exhausted marker. KEYS[6]: idempotency record.
-- ARGV[1]: count. ARGV[2]: record TTL (s). ARGV[3]: request fingerprint (type and count).
-- Returns {status, keys, remaining, exhausted, discarded}; status is 'taken',
-- 'replayed' (the keys of the first request with this idempotency key) or
-- 'mismatch' (the key was used for another type or count). Scripts run one at a
-- time, so concurrent retries see the first one's record: no lock is needed.
local discarded = enforce_fence()
local saved = redis.call('GET', KEYS[6])
if saved then
  local record = cjson.decode(saved)
  if record.request ~= ARGV[3] then
    return {'mismatch', {}, 0, 0, discarded}
  end
  return {'replayed', record.keys, redis.call('LLEN', KEYS[4]), 0, discarded}
end
local taken = redis.call('LPOP', KEYS[4], tonumber(ARGV[1]))
if not taken then
  return {'taken', {}, 0, redis.call('EXISTS', KEYS[5]), discarded}
end
redis.call('SET', KEYS[6], cjson.encode({request = ARGV[3], keys = taken}), 'EX', tonumber(ARGV[2]))
return {'taken', taken, redis.call('LLEN', KEYS[4]), 0, discarded}

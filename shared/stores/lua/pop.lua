-- Take up to ARGV[1] keys from the head of a hot list, behind the fence.
-- KEYS[4]: hot list. KEYS[5]: the type's exhausted marker. KEYS[6]: ledger stream.
-- KEYS[7]: the type's refill statistics (written by keysync).
-- ARGV[1]: count (>= 1). ARGV[2]: id type, when the type keeps a ledger, else ''.
-- ARGV[3...]: the API client of each requested key (or one for all), for the ledger.
-- Returns {keys, remaining, exhausted, discarded, refill}; exhausted is 1 only when no
-- key was available and the keyspace is used up (keysync sets the marker); refill is
-- {rate, at} from keysync when no key was available, else empty.
local discarded = enforce_fence()
local taken = redis.call('LPOP', KEYS[4], tonumber(ARGV[1]))
if not taken then
  local refill = redis.call('HMGET', KEYS[7], 'rate', 'at')
  return {{}, 0, redis.call('EXISTS', KEYS[5]), discarded, refill}
end
if ARGV[2] ~= '' then
  ledger_issue(KEYS[6], ARGV[2], taken, {unpack(ARGV, 3)}, '')
end
return {taken, redis.call('LLEN', KEYS[4]), 0, discarded, {}}

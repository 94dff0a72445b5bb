-- Take up to ARGV[1] keys from the head of a hot list, behind the fence.
-- KEYS[4]: hot list. KEYS[5]: the type's exhausted marker. ARGV[1]: count (>= 1).
-- Returns {keys, remaining, exhausted, discarded}; exhausted is 1 only when no
-- key was available and the keyspace is used up (keysync sets the marker).
local discarded = enforce_fence()
local taken = redis.call('LPOP', KEYS[4], tonumber(ARGV[1]))
if not taken then
  return {{}, 0, redis.call('EXISTS', KEYS[5]), discarded}
end
return {taken, redis.call('LLEN', KEYS[4]), 0, discarded}

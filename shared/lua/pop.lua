-- Take up to ARGV[1] keys from the head of a hot list.
-- KEYS[1]: hot list. KEYS[2]: the type's exhausted marker. ARGV[1]: count (>= 1).
-- Returns {keys, remaining length, exhausted}; exhausted is 1 only when no key
-- was available and the keyspace is used up (keysync sets the marker).
local taken = redis.call('LPOP', KEYS[1], tonumber(ARGV[1]))
if not taken then
  return {{}, 0, redis.call('EXISTS', KEYS[2])}
end
return {taken, redis.call('LLEN', KEYS[1]), 0}

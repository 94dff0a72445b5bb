-- Take up to ARGV[1] keys from the head of a hot list.
-- KEYS[1]: hot list. ARGV[1]: count (>= 1).
-- Returns {keys, remaining length}; keys is empty when the list is empty.
local taken = redis.call('LPOP', KEYS[1], tonumber(ARGV[1]))
if not taken then
  taken = {}
end
return {taken, redis.call('LLEN', KEYS[1])}

-- Append a keysync batch to a hot list, behind the fence; idempotent and pinned.
-- KEYS[4]: hot list. KEYS[5]: the batch's marker.
-- ARGV[1]: server token the push is pinned to ('' for none). ARGV[2]: marker TTL (s).
-- ARGV[3..]: the keys, in order.
-- Returns {length, discarded, token, status}; status is 'pushed', 'duplicate' (the
-- batch was pushed before: nothing added) or 'refused' (this server is not the
-- pinned one: nothing added). unpack() fails near 8,000 arguments: chunks.
local discarded, token = enforce_fence()
if ARGV[1] ~= '' and ARGV[1] ~= token then
  return {redis.call('LLEN', KEYS[4]), discarded, token, 'refused'}
end
if not redis.call('SET', KEYS[5], '1', 'NX', 'EX', tonumber(ARGV[2])) then
  return {redis.call('LLEN', KEYS[4]), discarded, token, 'duplicate'}
end
redis.call('SADD', KEYS[2], KEYS[4])
local length = redis.call('LLEN', KEYS[4])
local chunk = 1000
for i = 3, #ARGV, chunk do
  length = redis.call('RPUSH', KEYS[4], unpack(ARGV, i, math.min(i + chunk - 1, #ARGV)))
end
return {length, discarded, token, 'pushed'}

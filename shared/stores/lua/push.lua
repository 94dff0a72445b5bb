-- Append a keysync batch to a hot list, behind the fence; idempotent and pinned.
-- Returns {length, discarded, token, status}; status is 'pushed', 'duplicate' (the
-- batch was pushed before: nothing added) or 'refused' (this server is not the
-- pinned one: nothing added).
local hot_list = KEYS[4]
local batch_marker = KEYS[5]      -- exists once this batch was pushed
local pin = ARGV[1]               -- server token the push is pinned to ('' for none)
local marker_ttl = tonumber(ARGV[2])
local FIRST_KEY = 3               -- ARGV[3..]: the keys, in order
local CHUNK = 1000                -- unpack() fails near 8,000 arguments

local discarded, token = enforce_fence()
if pin ~= '' and pin ~= token then
  return {redis.call('LLEN', hot_list), discarded, token, 'refused'}
end
if not redis.call('SET', batch_marker, '1', 'NX', 'EX', marker_ttl) then
  return {redis.call('LLEN', hot_list), discarded, token, 'duplicate'}
end
redis.call('SADD', REGISTRY, hot_list)
local length = redis.call('LLEN', hot_list)
for i = FIRST_KEY, #ARGV, CHUNK do
  length = redis.call('RPUSH', hot_list, unpack(ARGV, i, math.min(i + CHUNK - 1, #ARGV)))
end
return {length, discarded, token, 'pushed'}

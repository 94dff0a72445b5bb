-- Append a keysync batch to a hot list, behind the fence; idempotent and pinned.
-- Returns {length, discarded, token, status}; status is 'pushed', 'duplicate' (the
-- batch was pushed before: nothing added), 'refused' (this server is not the pinned
-- one: nothing added) or 'stale' (the batch's sync-clock stamp shows PostgreSQL lost
-- commits, see sync_record.lua: nothing added).
local hot_list = KEYS[5]
local batch_marker = KEYS[6]      -- exists once this batch was pushed
local pin = ARGV[1]               -- server token the push is pinned to ('' for none)
local marker_ttl = tonumber(ARGV[2])
local timeline = tonumber(ARGV[3])  -- the batch's stamp; timeline 0: not recorded
local fork, clock = tonumber(ARGV[4]), tonumber(ARGV[5])
local packed = ARGV[6]            -- the keys, in order, joined by newlines (one
                                  -- argument: the client packs one string, not thousands)
local CHUNK = 1000                -- unpack() fails near 8,000 arguments

local discarded, token = enforce_fence()
if pin ~= '' and pin ~= token then
  return {redis.call('LLEN', hot_list), discarded, token, 'refused'}
end
if redis.call('EXISTS', batch_marker) == 1 then
  return {redis.call('LLEN', hot_list), discarded, token, 'duplicate'}
end
if timeline > 0 and record_stamp(timeline, fork, clock) ~= 'ok' then
  return {redis.call('LLEN', hot_list), discarded, token, 'stale'}
end
redis.call('SET', batch_marker, '1', 'EX', marker_ttl)
redis.call('SADD', REGISTRY, hot_list)
local length = redis.call('LLEN', hot_list)
local chunk, n = {}, 0
for key in string.gmatch(packed, '[^\n]+') do
  n = n + 1
  chunk[n] = key
  if n == CHUNK then
    length = redis.call('RPUSH', hot_list, unpack(chunk, 1, n))
    n = 0
  end
end
if n > 0 then
  length = redis.call('RPUSH', hot_list, unpack(chunk, 1, n))
end
return {length, discarded, token, 'pushed'}

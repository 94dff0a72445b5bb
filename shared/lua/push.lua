-- Append keys to a hot list.
-- KEYS[1]: hot list. ARGV: the keys, in order.
-- Returns the list's new length. unpack() fails near 8,000 arguments, so the
-- keys are appended in chunks.
local chunk = 1000
local length = redis.call('LLEN', KEYS[1])
for i = 1, #ARGV, chunk do
  length = redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + chunk - 1, #ARGV)))
end
return length

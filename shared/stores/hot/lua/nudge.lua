-- Ask keysync to refill an ID type now. Not fenced: a lost nudge costs one poll.
-- Keeps the wake list short: a nudge only needs to be seen once.
local wake_list = KEYS[1]
local type_name = ARGV[1]
local max_entries = tonumber(ARGV[2])

redis.call('LPUSH', wake_list, type_name)
redis.call('LTRIM', wake_list, 0, max_entries - 1)
return 1

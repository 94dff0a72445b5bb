-- Ask keysync to refill an ID type now.
-- KEYS[1]: wake list. ARGV[1]: id type. ARGV[2]: most entries kept.
-- Keeps the wake list short: a nudge only needs to be seen once.
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
return 1

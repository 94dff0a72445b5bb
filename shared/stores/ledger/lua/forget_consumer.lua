-- Remove a ledger consumer that stopped (its heartbeat expired) and holds no entry,
-- in one step: a consumer that beats again and reads entries between a check and a
-- removal made apart would lose them from every pending list. Not fenced.
-- Returns 1 when removed, 0 when it is alive or still holds entries.
local stream = KEYS[1]
local heartbeat = KEYS[2]         -- the consumer's heartbeat (ledger_consumer_key)
local group = ARGV[1]
local consumer = ARGV[2]

if redis.call('EXISTS', heartbeat) == 1 then
  return 0
end
if #redis.call('XPENDING', stream, group, '-', '+', 1, consumer) > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', stream, group, consumer)
return 1

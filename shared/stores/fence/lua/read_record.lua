-- The sync clock's record, behind the fence (so a new Redis server marks it untrusted
-- before anyone reads it). Returns {discarded, field, value, field, value, ...}.
local discarded = enforce_fence()
local fields = redis.call('HGETALL', SYNC_RECORD)
table.insert(fields, 1, discarded)
return fields

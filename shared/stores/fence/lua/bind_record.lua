-- Bind this namespace to a database on first use (one namespace, one database).
-- Returns {bound, discarded}: the database the namespace is bound to (ARGV[1] when
-- this call bound it).
local database = ARGV[1]

local discarded = enforce_fence()
redis.call('HSETNX', SYNC_RECORD, 'database', database)
return {redis.call('HGET', SYNC_RECORD, 'database'), discarded}

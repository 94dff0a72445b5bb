-- Record a committed range lease: its stamp and the type's highest leased counter.
-- Returns {status, discarded}: 'ok', or 'stale' (sync_record.lua: the range must not
-- be used; it is wasted, never reissued).
local leased_field = ARGV[1]      -- 'leased:<type>'
local range_end = tonumber(ARGV[2])
local timeline, fork, clock = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local discarded = enforce_fence()
-- The highest counter ever leased is kept even for a stale lease: the fence moves
-- sequences past it.
local known = tonumber(redis.call('HGET', SYNC_RECORD, leased_field)) or 0
if range_end > known then
  redis.call('HSET', SYNC_RECORD, leased_field, range_end)
end
return {record_stamp(timeline, fork, clock), discarded}

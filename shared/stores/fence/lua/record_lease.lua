-- Record a committed range lease: its stamp and the type's highest leased counter.
-- Returns {status, discarded}: 'ok', or why the range must not be used
-- (sync_record.lua's record_stamp: it is wasted, never reissued).
local leased_field = ARGV[1]      -- 'leased:<type>'
local range_end = tonumber(ARGV[2])
local database = ARGV[3]
local timeline, fork, clock = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local head = ARGV[7]              -- the ledger link the stamp names

local discarded = enforce_fence()
local status = record_stamp(database, timeline, fork, clock, head)
-- The highest counter ever leased is kept even for a refused lease (the fence moves
-- sequences past it), except for another database's counters, which say nothing here.
if status ~= 'foreign' then
  local known = tonumber(redis.call('HGET', SYNC_RECORD, leased_field)) or 0
  if range_end > known then
    redis.call('HSET', SYNC_RECORD, leased_field, range_end)
  end
end
return {status, discarded}

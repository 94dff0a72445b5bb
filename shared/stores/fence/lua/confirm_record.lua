-- A pending claim (reset_record.lua with several key groups) whose fence committed:
-- clear its mark, unless another claim replaced it meanwhile.
local expected = ARGV[1]

local discarded = enforce_fence()
if redis.call('HGET', SYNC_RECORD, 'claim_fences') == expected then
  redis.call('HDEL', SYNC_RECORD, 'claim_fences')
end
return {'ok', discarded}

-- Length of a hot list, behind the fence (so inherited keys are never counted).
-- Returns {length, discarded, token}.
local hot_list = KEYS[5]

local discarded, token = enforce_fence()
return {redis.call('LLEN', hot_list), discarded, token}

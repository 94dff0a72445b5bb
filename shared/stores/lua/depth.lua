-- Length of a hot list, behind the fence (so inherited keys are never counted).
-- KEYS[4]: hot list. Returns {length, discarded, token}.
local discarded, token = enforce_fence()
return {redis.call('LLEN', KEYS[4]), discarded, token}

-- An import's step on a hot list, behind the fence: raise the type's import epoch to
-- `epoch` (never lower it: push.lua refuses batches taken under an older one), then
-- remove every listed key from the list. Returns {removed, discarded}.
local hot_list = KEYS[5]
local import_epoch = KEYS[6]      -- the type's import epoch (kd_import_epochs)
local epoch = tonumber(ARGV[1])
local packed = ARGV[2]            -- the keys to remove, joined by newlines ('' for none)

local discarded = enforce_fence()
if epoch > tonumber(redis.call('GET', import_epoch) or '0') then
  redis.call('SET', import_epoch, epoch)
end
local removed = 0
for key in string.gmatch(packed, '[^\n]+') do
  removed = removed + redis.call('LREM', hot_list, 0, key)
end
return {removed, discarded}

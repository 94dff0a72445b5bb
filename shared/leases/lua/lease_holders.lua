-- Every live lease of a pool, behind the fence.
-- Returns {now, settle_until, {id, lease, ...}, {id, last, ...}}: leases as stored
-- (cjson, lease.lua), only those alive in the current lease epoch; every recorded last timestamp.
local LEASES = KEYS[5]        -- hash: machine id -> lease (lease.lua)
local LAST = KEYS[6]          -- hash: machine id -> highest timestamp recorded (ms)
local TTLS = KEYS[7]          -- the longest lease TTL granted (ms), any pool

local _, token = enforce_fence()
local now = now_ms()
local epoch, since = lease_epoch(token)
local ttl_max = tonumber(redis.call('GET', TTLS)) or 0
local live = {}
local all = redis.call('HGETALL', LEASES)
for i = 1, #all, 2 do
  if alive(cjson.decode(all[i + 1]), epoch, now) then
    table.insert(live, all[i])
    table.insert(live, all[i + 1])
  end
end
return {now, since + ttl_max, live, redis.call('HGETALL', LAST)}

-- Compare-and-extend a machine-ID lease, behind the fence: only the owner of a live
-- lease granted in the current lease epoch (lease.lua) may extend it, and the holder's new
-- timestamp ceiling is recorded in the same call.
-- Returns {status}: 'renewed', 'fenced' (a new lease epoch since the grant: the fence
-- took over; re-acquire) or 'lost' (expired, released or held by someone else).
local LEASES = KEYS[5]        -- hash: machine id -> lease (lease.lua)
local LAST = KEYS[6]          -- hash: machine id -> highest timestamp recorded (ms)
local TTLS = KEYS[7]          -- the longest lease TTL granted (ms), any pool
local id = ARGV[1]
local owner = ARGV[2]
local granted_in = ARGV[3]    -- the lease epoch it was granted in (lease.lua)
local ttl = tonumber(ARGV[4])
local ceiling = tonumber(ARGV[5])

local _, token = enforce_fence()
local now = now_ms()
local epoch = lease_epoch(token)
if granted_in ~= epoch then
  return {'fenced'}
end
local lease = read_lease(LEASES, id)
if not alive(lease, epoch, now) or lease.owner ~= owner then
  return {'lost'}
end
lease.expires = ms(now + ttl)
redis.call('HSET', LEASES, id, cjson.encode(lease))
raise_last(LAST, id, ceiling)
return {'renewed'}

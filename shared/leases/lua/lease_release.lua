-- Compare-and-delete a machine-ID lease, behind the fence: only its owner may release
-- it. With `issued` set (the highest timestamp the holder minted; it has stopped), the
-- last-timestamp record is set to max(floor at grant, issued), replacing the ceiling
-- the holder recorded; with '' the recorded ceiling stays.
-- Returns 1 when released, 0 when the caller was not the owner.
local LEASES = KEYS[5]        -- hash: machine id -> lease (lease.lua)
local LAST = KEYS[6]          -- hash: machine id -> highest timestamp recorded (ms)
local TTLS = KEYS[7]          -- the longest lease TTL granted (ms), any pool
local id = ARGV[1]
local owner = ARGV[2]
local issued = ARGV[3]

enforce_fence()
local lease = read_lease(LEASES, id)
if lease == nil or lease.owner ~= owner then
  return 0
end
redis.call('HDEL', LEASES, id)
if issued ~= '' then
  redis.call('HSET', LAST, id, ms(math.max(tonumber(issued), tonumber(lease.floor))))
end
return 1

-- Grant a free machine ID of [lo, hi] in a pool, behind the fence, in one call: scan
-- from `start` (random, chosen by the caller, so acquirers spread out) for an ID with
-- no live lease. Records the holder's timestamp ceiling for the ID before granting.
-- Returns {status, id, floor, epoch, wait_ms}: status 'granted' (floor: the highest
-- timestamp earlier holders recorded; mint strictly above it), 'full' (every ID held;
-- wait_ms until the first lease expires) or 'settling' (a new server identity: nothing
-- is granted for one TTL; wait_ms until grants resume).
local LEASES = KEYS[5]        -- hash: machine id -> lease (lease.lua)
local LAST = KEYS[6]          -- hash: machine id -> highest timestamp recorded (ms)
local TTLS = KEYS[7]          -- the longest lease TTL granted (ms), any pool
local lo = tonumber(ARGV[1])
local hi = tonumber(ARGV[2])
local start = tonumber(ARGV[3])
local owner = ARGV[4]
local ttl = tonumber(ARGV[5])
local ceiling = tonumber(ARGV[6])  -- holder's wall clock + its window (ms)

local _, token = enforce_fence()
local now = now_ms()
local epoch, since = lease_epoch(token)
local ttl_max = longest_ttl(TTLS, ttl)
if now < since + ttl_max then
  return {'settling', -1, 0, epoch, since + ttl_max - now}
end

local n = hi - lo + 1
local soonest = ttl
for i = 0, n - 1 do
  local id = lo + (start + i) % n
  local lease = read_lease(LEASES, id)
  if not alive(lease, epoch, now) then
    local floor = raise_last(LAST, id, ceiling)
    redis.call('HSET', LEASES, id, cjson.encode({
      owner = owner, fence = epoch, since = ms(now), expires = ms(now + ttl),
      ttl = ms(ttl), floor = ms(floor),
    }))
    return {'granted', id, floor, epoch, 0}
  end
  soonest = math.min(soonest, tonumber(lease.expires) - now)
end
return {'full', -1, 0, epoch, soonest}

-- Helper: machine-ID leases (lease_*.lua). Prepended after the fence.
-- A pool's leases live in one hash: field = machine id, value = cjson
-- {owner, fence, since, expires, ttl, floor}, times in ms of this server's TIME (as
-- strings: exact integers). `fence` is the lease epoch it was granted in (below).
-- `floor` is what the last-timestamp record held at the grant.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function ms(value)
  return string.format('%d', value)
end

local function read_lease(leases, id)
  local raw = redis.call('HGET', leases, id)
  if not raw then
    return nil
  end
  return cjson.decode(raw)
end

local function alive(lease, epoch, now)
  return lease ~= nil and lease.fence == epoch and tonumber(lease.expires) > now
end

-- The lease epoch: the server identity plus the time its fence took over
-- (`fenced_at` in the sync record, set by fence.lua). A lease carries the epoch it was
-- granted in and dies with it: every holder re-acquires after a failover, failback or
-- restart. Grants wait until `since + ttl_max`: by then every holder of the previous
-- epoch has passed its own deadline. First use counts as a takeover (an empty server
-- may be a restart that lost its leases).
-- Returns the epoch's name and since (ms).
local function lease_epoch(token)
  local since = redis.call('HGET', SYNC_RECORD, 'fenced_at') or '0'
  return token .. '@' .. since, tonumber(since)
end

-- The longest lease TTL granted (ms), raised to `ttl`.
local function longest_ttl(ttls, ttl)
  local longest = tonumber(redis.call('GET', ttls)) or 0
  if ttl > longest then
    redis.call('SET', ttls, ms(ttl))
    return ttl
  end
  return longest
end

-- Raise a machine id's last-timestamp record to `value` (never lowers it).
local function raise_last(last, id, value)
  local recorded = tonumber(redis.call('HGET', last, id)) or 0
  if value > recorded then
    redis.call('HSET', last, id, ms(value))
  end
  return recorded
end

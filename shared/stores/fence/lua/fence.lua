-- Fence prologue, prepended to every script that reads or writes hot lists.
-- Its KEYS slots come first in every fenced script's key list (see shared/stores/redis/scripts.py):
local FENCE = KEYS[1]      -- owner token: run_id:master_replid of the owning server
local REGISTRY = KEYS[2]   -- set of every hot list name
local DISCARDS = KEYS[3]   -- hash: hot list -> keys discarded by fences
local SYNC_RECORD = KEYS[4]  -- hash: the PostgreSQL sync clock's record (sync_record.lua),
                           -- and fenced_at: when this server's fence took over
--
-- Replication is asynchronous: a promoted replica, a failed-back primary or a
-- primary restarted from an older snapshot may hold keys that were already
-- dispensed. Such a server has a different run_id or master_replid than the one
-- that last owned the lists, so on first use it discards every hot list it
-- inherited (counted, never reissued) and takes ownership.
-- Only a primary may answer, even for reads: a demoted primary still holds its
-- old lists until it resyncs, and a caller must move on to the new primary.
local function server_token()
  local server = redis.call('INFO', 'server')
  local replication = redis.call('INFO', 'replication')
  if string.match(replication, 'role:(%a+)') ~= 'master' then
    error({err = 'READONLY keydispenser: this server is a replica, not the primary'})
  end
  return string.match(server, 'run_id:(%w+)') .. ':' ..
         string.match(replication, 'master_replid:(%w+)')
end

local function enforce_fence()
  local token = server_token()
  if redis.call('GET', FENCE) == token then
    return 0, token
  end
  local discarded = 0
  for _, list in ipairs(redis.call('SMEMBERS', REGISTRY)) do
    local n = redis.call('LLEN', list)
    if n > 0 then
      redis.call('HINCRBY', DISCARDS, list, n)
      redis.call('UNLINK', list)
      discarded = discarded + n
    end
  end
  -- The sync clock's record may have lost its latest updates with the old server:
  -- until a guarded write vouches for it again, PostgreSQL alone must prove it has
  -- not forked (see sync_record.lua). `fenced_at` (server ms) starts a new lease
  -- epoch: no machine ID is granted for one lease TTL after it (lease.lua).
  local now = redis.call('TIME')
  redis.call('HSET', SYNC_RECORD, 'untrusted', '1',
             'fenced_at', now[1] .. string.format('%03d', math.floor(tonumber(now[2]) / 1000)))
  redis.call('SET', FENCE, token)
  return discarded, token
end

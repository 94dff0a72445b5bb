-- Fence prologue, prepended to every script that reads or writes hot lists.
-- KEYS[1]: fence (owner token). KEYS[2]: registry of hot lists. KEYS[3]: discard counts.
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
  if redis.call('GET', KEYS[1]) == token then
    return 0, token
  end
  local discarded = 0
  for _, list in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    local n = redis.call('LLEN', list)
    if n > 0 then
      redis.call('HINCRBY', KEYS[3], list, n)
      redis.call('UNLINK', list)
      discarded = discarded + n
    end
  end
  redis.call('SET', KEYS[1], token)
  return discarded, token
end

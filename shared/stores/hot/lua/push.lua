-- Append a keysync batch to a hot list, behind the fence; idempotent, pinned and
-- bounded in time. Returns {length, discarded, token, status}; status is 'pushed',
-- 'duplicate' (the batch was pushed before: nothing added), 'superseded' (taken before
-- an import that may have excluded some of its keys: nothing added), 'refused' (this
-- server is not the pinned one: nothing added), 'expired' (past the batch's deadline: nothing
-- added, see below) or why its PostgreSQL stamp was refused (sync_record.lua's
-- record_stamp: 'stale', 'untrusted', 'foreign', 'halted'; nothing added).
local hot_list = KEYS[5]
local batch_marker = KEYS[6]      -- exists once this batch was pushed
local import_epoch = KEYS[7]      -- the type's import epoch (kd_import_epochs)
local pin = ARGV[1]               -- server token the push is pinned to ('' for none)
local marker_ttl = tonumber(ARGV[2])  -- ms the marker lives at least
-- The batch's deadline on this server's clock (ms; 0: none): set by keysync from this
-- server's TIME before its first attempt. The marker outlives it, so a retry either
-- finds the marker or is refused here: a keysync paused past the marker's life (a
-- SIGSTOP, a VM pause) can never push its batch a second time.
local not_after = tonumber(ARGV[3])
local database = ARGV[4]          -- the batch's stamp; timeline 0: not recorded
local timeline = tonumber(ARGV[5])
local fork, clock = tonumber(ARGV[6]), tonumber(ARGV[7])
local head = ARGV[8]              -- the ledger link the stamp names
local packed = ARGV[9]            -- the keys, in order, joined by newlines (one
                                  -- argument: the client packs one string, not thousands)
-- The import epoch the batch was taken under (read in the statement that took its
-- keys): a batch older than the epoch an import set here may hold IDs that import
-- excluded, taken before it removed them from the cold table ('superseded': nothing
-- added, the batch is lost).
local epoch = tonumber(ARGV[10])
local CHUNK = 1000                -- unpack() fails near 8,000 arguments

local discarded, token = enforce_fence()
if pin ~= '' and pin ~= token then
  return {redis.call('LLEN', hot_list), discarded, token, 'refused'}
end
if redis.call('EXISTS', batch_marker) == 1 then
  return {redis.call('LLEN', hot_list), discarded, token, 'duplicate'}
end
if epoch < tonumber(redis.call('GET', import_epoch) or '0') then
  return {redis.call('LLEN', hot_list), discarded, token, 'superseded'}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if not_after > 0 and now > not_after then
  return {redis.call('LLEN', hot_list), discarded, token, 'expired'}
end
if timeline > 0 then
  local status = record_stamp(database, timeline, fork, clock, head)
  if status ~= 'ok' then
    return {redis.call('LLEN', hot_list), discarded, token, status}
  end
end
redis.call('SET', batch_marker, '1', 'PX', math.max(marker_ttl, not_after - now + 1000))
redis.call('SADD', REGISTRY, hot_list)
local length = redis.call('LLEN', hot_list)
local chunk, n = {}, 0
for key in string.gmatch(packed, '[^\n]+') do
  n = n + 1
  chunk[n] = key
  if n == CHUNK then
    length = redis.call('RPUSH', hot_list, unpack(chunk, 1, n))
    n = 0
  end
end
if n > 0 then
  length = redis.call('RPUSH', hot_list, unpack(chunk, 1, n))
end
return {length, discarded, token, 'pushed'}

-- Take up to `count` keys from the head of a hot list, behind the fence.
-- Returns {keys, remaining, exhausted, discarded, refill}; exhausted is 1 only when no
-- key was available and the keyspace is used up (keysync sets the marker); refill is
-- {rate, at} from keysync when no key was available, else empty.
local hot_list = KEYS[5]
local exhausted_marker = KEYS[6]  -- set by keysync once the type's keyspace is used up
local ledger_stream = KEYS[7]
local refill_stats = KEYS[8]      -- hash {rate, at} written by keysync
local count = tonumber(ARGV[1])   -- >= 1
local ledger_type = ARGV[2]       -- the type's name when it keeps a ledger, else ''
local FIRST_CLIENT = 3            -- ARGV[3..]: the API client of each key (or one for all)

local discarded = enforce_fence()
-- Unpacked before the pop: a failure here (too many arguments) must not lose keys.
local clients = ledger_type ~= '' and {unpack(ARGV, FIRST_CLIENT)} or {}
local taken = redis.call('LPOP', hot_list, count)
if not taken then
  local refill = redis.call('HMGET', refill_stats, 'rate', 'at')
  return {{}, 0, redis.call('EXISTS', exhausted_marker), discarded, refill}
end
if ledger_type ~= '' then
  ledger_issue(ledger_stream, ledger_type, taken, clients, '')
end
return {taken, redis.call('LLEN', hot_list), 0, discarded, {}}

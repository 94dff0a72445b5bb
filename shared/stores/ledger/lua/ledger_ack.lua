-- Acknowledge applied ledger entries and keep a copy of each for a while (retention).
-- A PostgreSQL promotion can lose the last commits of the ledger; until the copies
-- expire, keysync applies them again after a fence (applying again changes nothing).
-- Each copy carries its entry's own ID in the field 'id': an entry applied again is
-- recognised by that ID. Not fenced: nothing here can hand out a key.
-- Returns how many entries were acknowledged.
local stream = KEYS[1]
local retained = KEYS[2]          -- ledger_retained_key
local group = ARGV[1]
local retain_ms = tonumber(ARGV[2])
-- ARGV[3..]: the applied entries' IDs

local done = 0
for i = 3, #ARGV do
  local found = redis.call('XRANGE', stream, ARGV[i], ARGV[i])
  if #found == 1 and retain_ms > 0 then
    local copy = {'id', ARGV[i]}
    local fields = found[1][2]
    for j = 1, #fields do
      copy[#copy + 1] = fields[j]
    end
    redis.call('XADD', retained, '*', unpack(copy))
  end
  done = done + redis.call('XACK', stream, group, ARGV[i])
  redis.call('XDEL', stream, ARGV[i])
end
local now = redis.call('TIME')
local oldest = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - retain_ms
redis.call('XTRIM', retained, 'MINID', '~', string.format('%d', math.max(oldest, 0)))
return done

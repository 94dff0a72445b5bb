-- Rebuild a record Redis lost (a new server: untrusted; or none at all) from a
-- PostgreSQL that has not forked since its last guarded write (postgres_fence.py
-- checks that under the clock row's lock, and this runs before that lock is let go):
-- its stamp (with the ledger link it names), every leased:<type> raised to the highest
-- counter its history leased, and the ledger restore it holds pending (a fence's, whose
-- claim Redis lost), before anything judges PostgreSQL by the record again.
-- Returns {status, discarded}: 'ok' (rebuilt), 'trusted' (another process rebuilt it
-- first: nothing changed), 'foreign', 'superseded' (the record follows a newer
-- timeline), 'halted', 'stale' (Redis lost state again since the vouch was decided).
local database = ARGV[1]
local timeline, fork, clock = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local head = ARGV[5]
local restore_to = ARGV[6]        -- '' when none is pending
local epoch = ARGV[7]             -- fenced_at of the record the vouch was decided on ('-': any)
local FIRST_HIGH = 8              -- ARGV[8..]: leased:<type>, highest counter, ...

local discarded = enforce_fence()
-- Redis lost state again since the vouch read the record (the vouching process stalled
-- between its commit and this): the stamp may be older than guarded writes recorded in
-- between, whose record Redis lost; a record rebuilt from it would not cover them.
if epoch ~= '-' and (redis.call('HGET', SYNC_RECORD, 'fenced_at') or '') ~= epoch then
  return {'stale', discarded}
end
local rec = redis.call('HMGET', SYNC_RECORD, 'timeline', 'untrusted', 'halted', 'database')
if rec[3] == '1' then
  return {'halted', discarded}
end
if rec[4] and rec[4] ~= database then
  return {'foreign', discarded}
end
local tl = tonumber(rec[1]) or 0
if rec[2] ~= '1' and tl ~= 0 then
  return {'trusted', discarded}
end
if tl > timeline then
  return {'superseded', discarded}
end
raise_leased(FIRST_HIGH)
redis.call('HSET', SYNC_RECORD, 'database', database, 'timeline', timeline, 'fork', fork,
           'clock', clock, 'head', head)
redis.call('HDEL', SYNC_RECORD, 'untrusted')
if restore_to ~= '' then
  redis.call('HSET', SYNC_RECORD, 'restore_from', restore_to)
else
  redis.call('HDEL', SYNC_RECORD, 'restore_from')
end
return {'ok', discarded}

-- Ledger helper: record issued keys in the ledger stream, in the same script as the pop,
-- so every key a client was given has its entry (drained into PostgreSQL by keysync).
-- clients: one name per key, or a single name for all. The entry ID's milliseconds are
-- the issue time (the Redis server clock).
local function ledger_issue(stream, type_name, taken, clients, idempotency_key)
  local names = clients
  if #clients > #taken then
    names = {}
    for i = 1, #taken do names[i] = clients[i] end
  end
  redis.call('XADD', stream, '*', 'op', 'issue', 'type', type_name,
             'keys', table.concat(taken, ' '), 'clients', table.concat(names, ' '),
             'idem', idempotency_key)
end

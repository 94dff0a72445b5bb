"""The adapters of the ports, one package per mechanism.

- ``redis``: reaching a Redis primary (one server, Sentinel, Cluster) and running Lua
  scripts on it; every script's key list.
- ``fence``: the fences: the Redis fence every script starts with, the PostgreSQL
  fence's record in Redis, its guard and fence in PostgreSQL, the namespace binding.
- ``hot``: the hot lists: pop, push, depth, keysync's wake channel.
- ``ledger``: the audit ledger: its Redis stream and its PostgreSQL tables.
- ``postgres``: the cold tier: connections, migrations, ranges, takes.
- ``groups``: a store per key group, and the routers that give a process one port over
  them; ``memory``: the in-memory adapters of every port, for unit tests.

Each mechanism's Lua is in its package's ``lua/`` folder, its SQL in its ``sql.py``.
"""

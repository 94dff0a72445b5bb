"""The fences that keep a key from being handed out twice across failovers.

``lua/fence.lua`` starts every hot-list and lease script (the Redis fence); the
PostgreSQL fence is its record in Redis (``sync_record``, ``lua/*_record.lua``), the
guard every range lease and batch take runs behind and the fence itself (``sql``,
``postgres_fence``), and the binding of a database to one Redis namespace
(``binding``). docs/reliability.md explains them."""

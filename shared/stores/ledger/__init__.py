"""The audit ledger: the Redis stream the pop script appends to (``stream``) and the
per-type PostgreSQL tables keysync applies it to (``table``, ``sql``)."""

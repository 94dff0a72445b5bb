"""The cold tier in PostgreSQL: connections (``connect``), migrations (``schema``,
``migrations/``), range leases, COPYs and batch takes (``cold_store``, ``sql``)."""

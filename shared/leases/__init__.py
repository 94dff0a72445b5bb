"""Machine-ID leases: the holder a process keeps (``holder``), the Redis calls
(``store``) and their scripts (``lua/``); the pure rules are ``shared.domain.leases``.
docs/leases.md explains them."""

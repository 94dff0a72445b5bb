"""The ``keydispenser`` command line of the runtime: the three processes, migrate,
status, retire, apikey, secret, lease, decode and fence-postgres. The operator tooling
(``keydispenser_ops``) adds its own as plugins, found through entry points (``plugins.py``)."""

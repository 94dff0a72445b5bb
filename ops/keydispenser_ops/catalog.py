"""What ``keydispenser bench`` can measure: each benchmark's name, the module under
``ops/keydispenser_ops/bench/`` that runs it (loaded only when it runs), and what it measures.

The command line offers these names without importing a benchmark: the production
image runs ``keydispenser dispenser`` without the ``ops`` extra that benchmarks need.
"""

from __future__ import annotations

BENCHES: dict[str, str] = {
    "keygen": "valid IDs/s generated and filtered into the cold table",
    "fence": "the fenced pop script against the same pop without the fence",
    "dispense": "HTTP: single IDs and batches on uvicorn and granian, against bare apps",
    "fastpath": "dispenser CPU per single-ID request, no HTTP server",
    "snowflake": "snowflake IDs/s minted over HTTP, single and batch",
    "keysync": "keys/s moved from the cold table to the hot lists",
    "ledger": "ledger records applied per second per keysync, and at a rate offered",
    "lifecycle": "MOSIP's PUT /uin and the ledger lookup, p50/p99 under a steady load",
    "pipeline": "keys/s through all three processes at once",
    "client": "keys/s through the Python client, sync and async",
    "import": "keydispenser import: rows/s, memory, a rerun; keygen with the IDs excluded",
}

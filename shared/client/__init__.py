"""A Python client for keydispenser: keys fetched in batches in the background and
handed out from a local buffer (``KeyClient`` for threads, ``AsyncKeyClient`` for
asyncio). Needs only httpx (``pip install 'keydispenser[client]'``); it imports nothing
of the server. docs/client.md describes it.
"""

from shared.client.aio import AsyncKeyClient
from shared.client.protocol import (
    Buffering,
    ClientError,
    KeyspaceExhausted,
    KeysUnavailable,
    RequestRefused,
)
from shared.client.sync import KeyClient

__all__ = [
    "AsyncKeyClient",
    "Buffering",
    "ClientError",
    "KeyClient",
    "KeysUnavailable",
    "KeyspaceExhausted",
    "RequestRefused",
]

"""A Python client for keydispenser: keys fetched in batches in the background and
handed out from a local buffer (``KeyClient`` for threads, ``AsyncKeyClient`` for
asyncio). Its own distribution (``clients/python``, ``keydispenser-client``): it needs
only httpx and imports nothing of the server. docs/client.md describes it.
"""

from keydispenser_client.aio import AsyncKeyClient
from keydispenser_client.auth import BearerToken, ClientCredentials
from keydispenser_client.protocol import (
    Buffering,
    ClientError,
    KeyspaceExhausted,
    KeysUnavailable,
    RequestRefused,
)
from keydispenser_client.sync import KeyClient

__all__ = [
    "AsyncKeyClient",
    "BearerToken",
    "Buffering",
    "ClientCredentials",
    "ClientError",
    "KeyClient",
    "KeysUnavailable",
    "KeyspaceExhausted",
    "RequestRefused",
]

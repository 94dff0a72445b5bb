"""What both clients hand httpx, in one place: the client's options and the URL of a
batch request."""

from __future__ import annotations

from typing import Any

import httpx

from keydispenser_client import protocol
from keydispenser_client.protocol import Buffering


def options(
    base_url: str,
    api_key: str | None,
    auth: httpx.Auth | None,
    timeout_s: float,
    buffering: Buffering,
) -> dict[str, Any]:
    """The keyword arguments of ``httpx.Client`` and ``httpx.AsyncClient`` alike (the
    transport aside): a connection per fetcher, and a few for marks of use."""
    return {
        "base_url": base_url,
        "headers": protocol.headers(api_key),
        "auth": auth,
        "timeout": timeout_s,
        "limits": httpx.Limits(max_connections=buffering.fetchers + 4),
    }


def fetch_url(
    client: httpx.Client | httpx.AsyncClient, id_type: str, buffering: Buffering
) -> httpx.URL:
    """The batch request's URL, built once: httpx merging the base URL and the query on
    every request costs about as much CPU as parsing the batch it fetches."""
    path = protocol.fetch_path(id_type)
    return client.build_request("POST", path, params={"count": buffering.batch}).url

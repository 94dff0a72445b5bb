"""Sentinel discovery keeps each Sentinel's own error in the final error."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import pytest

from shared.domain.config import SentinelConfig
from shared.domain.errors import StoreUnavailable
from shared.stores.redis.endpoint import RedisEndpoint
from tests.integration.fixtures import Servers


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_every_sentinel_error_is_reported(servers: Servers) -> None:
    redis = urlsplit(servers.redis_url)
    not_a_sentinel = f"{redis.hostname}:{redis.port}"  # a Redis server, not a Sentinel
    nobody = f"127.0.0.1:{closed_port()}"
    endpoint = RedisEndpoint(sentinel=SentinelConfig(sentinels=(not_a_sentinel, nobody)))
    try:
        with pytest.raises(StoreUnavailable) as caught:
            await endpoint.client()
    finally:
        await endpoint.close()
    message = str(caught.value)
    assert f"sentinel {not_a_sentinel}: " in message
    assert "sentinel" in message.split(not_a_sentinel, 1)[1].lower()  # Redis's own refusal
    assert f"sentinel {nobody}: " in message
    assert "no answers" not in message

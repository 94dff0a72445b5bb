from __future__ import annotations

import pytest
from pydantic import SecretStr
from redis.exceptions import (
    BusyLoadingError,
    ConnectionError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
)

from shared.stores.redis_endpoint import means_primary_moved


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionError("Connection refused"),
        TimeoutError("Timeout reading from socket"),
        ReadOnlyError("You can't write against a read only replica."),
        BusyLoadingError("Redis is loading the dataset in memory"),
        ResponseError("NOREPLICAS Not enough good replicas to write."),
        ResponseError("MASTERDOWN Link with MASTER is down"),
        ResponseError("Error running script: @user_script:1: READONLY You can't write"),
        ResponseError("You can't write against a read only replica. script: abc"),
    ],
)
def test_errors_that_mean_the_primary_may_have_moved(exc: Exception) -> None:
    assert means_primary_moved(exc)


@pytest.mark.parametrize(
    "exc", [ResponseError("WRONGTYPE Operation against a key"), ResponseError("NOSCRIPT")]
)
def test_other_errors_do_not(exc: Exception) -> None:
    assert not means_primary_moved(exc)


async def test_no_client_the_endpoint_builds_retries_by_itself() -> None:
    """redis-py retries a command 10 times by default: that would re-run pops."""
    from shared.domain.config import SentinelConfig
    from shared.stores.redis_endpoint import RedisEndpoint, redis_client

    config = SentinelConfig(sentinels=("127.0.0.1:1", "127.0.0.1:2"), password=SecretStr("p"))
    clients = [redis_client(("127.0.0.1", 1), config), redis_client(("127.0.0.1", 1))]
    plain = RedisEndpoint("redis://127.0.0.1:1/0")
    clients.append(await plain.client())
    for client in clients:
        retry = client.get_retry()
        assert retry is not None and retry._retries == 0
        await client.aclose()


def test_sentinel_tls_and_credentials_reach_servers_and_sentinels() -> None:
    """Sentinel connections used to ignore tls and username: a plaintext side door."""
    from redis.asyncio.connection import SSLConnection

    from shared.domain.config import SentinelConfig
    from shared.stores.redis_endpoint import redis_client

    config = SentinelConfig(
        sentinels=("s1:26379",),
        username="kd",
        password=SecretStr("p"),
        sentinel_username="watch",
        tls=True,
        tls_ca_file="/etc/kd/ca.pem",
        tls_cert_file="/etc/kd/client.pem",
        tls_key_file="/etc/kd/client.key",
    )
    server = redis_client(("r1", 6379), config)
    sentinel = redis_client(("s1", 26379), config, db=0, username="watch", password=None)
    for client, user in ((server, "kd"), (sentinel, "watch")):
        pool = client.connection_pool
        assert pool.connection_class is SSLConnection
        kwargs = pool.connection_kwargs
        assert kwargs["username"] == user
        assert kwargs["ssl_ca_certs"] == "/etc/kd/ca.pem"
        assert kwargs["ssl_certfile"] == "/etc/kd/client.pem"
        assert kwargs["ssl_cert_reqs"] == "required" and kwargs["ssl_check_hostname"] is True

from __future__ import annotations

import pytest
from pydantic import SecretStr
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

from shared.domain.config import ClusterConfig, load_settings
from shared.domain.errors import ConfigError
from shared.stores.redis.endpoint import _owner_in, config_epoch, describe, means_primary_moved
from tests.conftest import EMPTY_CONFIG, TEST_SECRET


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
        # A cluster's redirections, as redis-py's parser raises them (prefix stripped).
        MovedError("15346 127.0.0.1:7001"),
        AskError("15346 127.0.0.1:7001"),
        TryAgainError("Multiple keys request during rehashing of slot"),
        ClusterDownError("The cluster is down"),
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
    from shared.stores.redis.endpoint import RedisEndpoint, redis_client

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
    from shared.stores.redis.endpoint import redis_client

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


def test_a_redirection_says_what_it_was() -> None:
    assert describe(MovedError("15346 127.0.0.1:7001")).startswith("MOVED 15346 127.0.0.1:7001")
    assert describe(AskError("15346 127.0.0.1:7001")).startswith("ASK 15346")
    assert describe(ResponseError("WRONGTYPE x")) == "WRONGTYPE x"


def test_the_slot_owner_is_read_from_the_cluster_map() -> None:
    """CLUSTER SLOTS: [start, end, [host, port, id], replicas...]; an empty host is the
    asked node's host, "?" (no hostname to announce) names no address."""
    slots = [
        [0, 5460, ["127.0.0.1", 7000, "a"], ["127.0.0.1", 7003, "d"]],
        [5461, 10922, ["", 7001, "b"]],
        [10923, 16382, [b"10.0.0.3", 7002, "c"]],
        [16383, 16383, ["?", 7004, "e"]],
    ]
    assert _owner_in(slots, 0, ("x", 1)) == ("127.0.0.1", 7000, "a")
    assert _owner_in(slots, 6000, ("127.0.0.9", 7001)) == ("127.0.0.9", 7001, "b")
    assert _owner_in(slots, 16382, ("x", 1)) == ("10.0.0.3", 7002, "c")
    assert _owner_in(slots, 16383, ("x", 1)) is None
    assert _owner_in(slots[:1], 6000, ("x", 1)) is None


def test_a_claim_is_weighed_by_its_config_epoch() -> None:
    nodes = (
        "a1 127.0.0.1:7000@17000,n0 myself,master - 0 0 7 connected 0-5460\n"
        "b2 127.0.0.1:7001@17001 master,fail - 0 0 2 disconnected\n"
    )
    assert config_epoch(nodes, "a1") == 7
    assert config_epoch(nodes.encode(), "b2") == 2
    assert config_epoch(nodes, "zz") == -1


def test_cluster_keys_share_the_namespace_hash_tag() -> None:
    plain = load_settings(EMPTY_CONFIG, permutation_key=TEST_SECRET, redis_namespace="prod")
    cluster = load_settings(
        EMPTY_CONFIG,
        permutation_key=TEST_SECRET,
        redis_namespace="prod",
        redis_cluster={"nodes": ["127.0.0.1:7000"]},
    )
    assert plain.redis_key_namespace == "prod"
    assert cluster.redis_key_namespace == "{prod}"
    assert cluster.lease_wait_replicas_or_default() == 1


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {
                "redis_cluster": {"nodes": ["127.0.0.1:7000"]},
                "redis_sentinel": {"sentinels": ["127.0.0.1:26379"]},
            },
            "redis_cluster: not with redis_sentinel",
        ),
        ({"redis_cluster": {"nodes": ["no-port"]}}, r"redis_cluster.*'no-port' must be host:port"),
        ({"redis_cluster": {"nodes": []}}, r"redis_cluster\.nodes"),
        ({"redis_cluster": {"nodes": ["h:1"], "db": 2}}, r"redis_cluster\.db"),
    ],
)
def test_a_bad_cluster_setting_is_named(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(EMPTY_CONFIG, permutation_key=TEST_SECRET, **values)


def test_cluster_tls_and_credentials_reach_every_node() -> None:
    from redis.asyncio.connection import SSLConnection

    from shared.stores.redis.endpoint import redis_client

    config = ClusterConfig(
        nodes=("n1:7000",), username="kd", password=SecretStr("p"), tls=True, tls_ca_file="/ca"
    )
    kwargs = redis_client(("n2", 7001), config).connection_pool.connection_kwargs
    assert redis_client(("n2", 7001), config).connection_pool.connection_class is SSLConnection
    assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("kd", "p", 0)
    assert kwargs["ssl_ca_certs"] == "/ca" and kwargs["ssl_cert_reqs"] == "required"


def test_a_cluster_endpoint_needs_the_namespace_its_slot_is_of() -> None:
    """Without it every process would look for slot 0's primary: another shard."""
    from shared.stores.redis.endpoint import RedisEndpoint

    with pytest.raises(ValueError, match="key namespace"):
        RedisEndpoint(cluster=ClusterConfig(nodes=("127.0.0.1:7000",)))

"""A Redis Cluster on loopback: primaries with their replicas, each an ``EmbeddedRedis``
started with ``--cluster-enabled yes``, joined and given slots with the cluster's own
commands (what ``redis-cli --cluster create`` sends), so that no ``redis-cli`` is
needed. For tests and drills; never a production topology (one machine).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from keydispenser_ops.embedded import EmbeddedRedis, EmbeddedServerError, free_port
from keydispenser_ops.processes import kill_process
from shared.stores.redis.endpoint import config_epoch

SLOTS = 16_384
READY_S = 30.0


@dataclass
class ClusterNode:
    server: EmbeddedRedis
    bus_port: int
    node_id: str = ""
    _client: redis.Redis | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def client(self) -> redis.Redis:
        """One client per node, kept (it reconnects after a restart of the node)."""
        if self._client is None:
            self._client = redis.Redis(
                port=self.server.port,
                decode_responses=True,
                socket_timeout=2.0,
                socket_connect_timeout=2.0,
            )
        return self._client

    def command(self, *args: Any) -> Any:
        return self.client().execute_command(*args)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@dataclass
class EmbeddedRedisCluster:
    """``primaries`` shards of ``replicas`` replicas each. ``node_timeout_ms`` is the
    cluster's failure detection time: a killed primary is replaced by its replica
    about that long after it stopped answering."""

    data_dir: Path
    primaries: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1_000
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def seeds(self) -> tuple[str, ...]:
        """Every node's address (``redis_cluster.nodes``)."""
        return tuple(node.address for node in self.nodes)

    def start(self) -> None:
        try:
            for i in range(self.primaries * (1 + self.replicas)):
                bus_port = free_port()
                server = EmbeddedRedis(self.data_dir / f"node-{i}")
                server.start(*self._options(bus_port))
                self.nodes.append(ClusterNode(server, bus_port))
            self._create()
        except BaseException:
            self.stop()
            raise

    def _options(self, bus_port: int) -> tuple[str, ...]:
        return (
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--cluster-port",
            str(bus_port),
            "--repl-diskless-sync-delay",
            "0",
            # A shard without a primary leaves the others serving their slots (the
            # default refuses every slot while any is uncovered): what types spread over
            # shards rely on (docs/operations.md, "Redis Cluster").
            "--cluster-require-full-coverage",
            "no",
        )

    def _create(self) -> None:
        """Slots to the primaries (even shares), one config epoch each, every node
        met, then each replica set to follow its primary."""
        for node in self.nodes:
            node.node_id = str(node.command("CLUSTER", "MYID"))
        heads = self.nodes[: self.primaries]
        for i, node in enumerate(heads):
            first, last = SLOTS * i // self.primaries, SLOTS * (i + 1) // self.primaries - 1
            node.command("CLUSTER", "ADDSLOTSRANGE", first, last)
            node.command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for node in self.nodes[1:]:
            self.nodes[0].command("CLUSTER", "MEET", "127.0.0.1", node.server.port, node.bus_port)
        ids = {node.node_id for node in self.nodes}
        # Known by their IDs (a node still in handshake shows a temporary one).
        self._wait(lambda: all(ids <= self._known(n) for n in self.nodes), "met")
        for i, node in enumerate(self.nodes[self.primaries :]):
            node.command("CLUSTER", "REPLICATE", heads[i % self.primaries].node_id)
        self.wait_healthy()

    def _known(self, node: ClusterNode) -> set[str]:
        """The IDs of the nodes ``node`` knows, handshakes done."""
        lines = str(node.command("CLUSTER", "NODES")).splitlines()
        return {line.split()[0] for line in lines if line and "handshake" not in line}

    def wait_healthy(self, timeout_s: float = READY_S) -> None:
        """Every live node says the cluster is ok, and every replica is in sync."""

        def healthy() -> bool:
            for node in self.live():
                info = node.command("CLUSTER", "INFO")
                if "cluster_state:ok" not in str(info):
                    return False
                replication = node.client().info("replication")
                if replication.get("role") == "slave" and (
                    replication.get("master_link_status") != "up"
                ):
                    return False
            return True

        self._wait(healthy, "healthy", timeout_s)

    def live(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.server.process and n.server.process.poll() is None]

    def primary_of(self, slot: int) -> ClusterNode:
        """The live node that serves ``slot`` as a primary in its own view; of two (a
        node restarted with its old config claims its slots until told otherwise), the
        one with the higher config epoch, as the cluster decides."""
        claims: list[tuple[int, ClusterNode]] = []
        for node in self.live():
            if node.client().info("replication").get("role") != "master":
                continue
            for entry in node.command("CLUSTER", "SLOTS"):
                if int(entry[0]) <= slot <= int(entry[1]) and int(entry[2][1]) == node.server.port:
                    epoch = config_epoch(node.command("CLUSTER", "NODES"), node.node_id)
                    claims.append((epoch, node))
        if not claims:
            raise EmbeddedServerError(f"no live primary serves slot {slot}")
        return max(claims, key=lambda claim: claim[0])[1]

    def spread(self, namespace: str, stems: Sequence[str]) -> list[str]:
        """A type name per stem (the stem, else the stem and a number) whose key group
        (``{<namespace>.<name>}``: ``slot_per: type``) lands on a shard no earlier name
        landed on: types spread over the shards as far as there are shards."""
        taken: set[str] = set()
        names = []
        shards = sum(
            1 for node in self.live() if node.client().info("replication")["role"] == "master"
        )
        for stem in stems:
            for n in range(1, 10_000):
                name = stem if n == 1 else f"{stem}_{n}"
                shard = self.primary_of(key_slot(f"{{{namespace}.{name}}}".encode())).address
                if shard not in taken or len(taken) >= shards:
                    taken.add(shard)
                    names.append(name)
                    break
        return names

    def claimants(self, slot: int) -> list[ClusterNode]:
        """Every live node that says it is a primary serving ``slot``."""
        found = []
        for node in self.live():
            try:
                if node.client().info("replication").get("role") != "master":
                    continue
                for entry in node.command("CLUSTER", "SLOTS"):
                    if int(entry[0]) <= slot <= int(entry[1]) and (
                        int(entry[2][1]) == node.server.port
                    ):
                        found.append(node)
            except redis.RedisError:
                continue
        return found

    def replica_of(self, primary: ClusterNode) -> ClusterNode:
        for node in self.live():
            replication = node.client().info("replication")
            if replication.get("role") == "slave" and (
                int(replication.get("master_port", 0)) == primary.server.port
            ):
                return node
        raise EmbeddedServerError(f"{primary.address} has no live replica")

    def failover(self, replica: ClusterNode, timeout_s: float = READY_S) -> None:
        """``CLUSTER FAILOVER`` on ``replica`` (its primary stays up), and wait until it
        is the primary. The command only starts a manual failover, which gives up by
        itself after twice the node timeout (a busy machine can make it): then it is
        asked again, until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        attempt_s = max(5.0, 3 * self.node_timeout_ms / 1000)
        while True:
            replica.command("CLUSTER", "FAILOVER")
            try:
                self._wait(
                    lambda: replica.client().info("replication").get("role") == "master",
                    "failed over",
                    min(attempt_s, max(deadline - time.monotonic(), 0.1)),
                )
                return
            except EmbeddedServerError:
                if time.monotonic() > deadline:
                    raise

    def restart(self, node: ClusterNode) -> None:
        """Start a killed node again on its ports: empty (no persistence), with its
        cluster config file, so it rejoins as what the cluster says it is now."""
        node.server.start(*self._options(node.bus_port))

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL a node (its data is gone: no persistence)."""
        kill_process(node.server.process)

    def _wait(self, check: Any, what: str, timeout_s: float = READY_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if check():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"cluster not {what} within {timeout_s}s")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.close()
            node.server.stop()

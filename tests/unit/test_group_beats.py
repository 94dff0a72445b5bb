"""keysync's heartbeat with one refill loop per key group (types spread over a
cluster's shards): alive while any loop turns, ready only while every group's last
turn succeeded."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from keysync.main import GroupBeats
from shared.metrics import Heartbeat


def test_ready_only_while_every_group_succeeds() -> None:
    now = [0.0]
    heartbeat = Heartbeat(CollectorRegistry(), stall_after_s=5, clock=lambda: now[0])
    beats = GroupBeats(heartbeat, 2)
    first, second = beats.lane(0), beats.lane(1)
    first(True)
    assert not heartbeat.ready()  # the second group has not turned yet
    second(True)
    assert heartbeat.ready()
    second(False)  # its shard is down
    now[0] = 3.0
    first(True)  # the other group still turns: alive, not ready
    assert heartbeat.alive() and not heartbeat.ready()
    second(True)
    assert heartbeat.ready()

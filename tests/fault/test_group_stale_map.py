"""A group member that has lost its partitions must rejoin after every node it knew moved.

Found by a randomized soak (node kills, pauses, ZooKeeper pauses): a member dropped its
partitions on its session clock (no heartbeat answered for a session), so it fetched
nothing and nothing re-read its routing map; meanwhile every node restarted on another
port (LocalCluster, like `fabric node` with ``port = 0``, picks a free one each start).
Each heartbeat then asked FIND_COORDINATOR of the first address in its stale map, whose
connect wait (1 s) used up the heartbeat's whole budget, so the map was never re-read
(the refresh after the failed candidates was bounded by that spent budget) and the dead
address was never moved to the back. The members polled for 9 minutes without rejoining,
the group "empty" and its lag growing, until the soak killed them.
"""

from __future__ import annotations

import time

import pytest

from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer
from tests.fault.harness import wait_for_full_isr

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 6_000
REJOIN_WAIT_S = 60.0


def test_member_rejoins_after_every_node_restarted_on_other_ports(fresh_cluster: LocalCluster) -> None:
    bootstrap, topic, group = fresh_cluster.bootstrap, "stale-map", "stale-map-group"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync": 2})
    with Producer(bootstrap) as producer:
        for i in range(10):
            producer.send(topic, b"before-%d" % i).result(timeout=30)
    consumer = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                        session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=1_000)
    try:
        consumer.subscribe([topic])
        seen: set[bytes] = set()
        deadline = time.monotonic() + REJOIN_WAIT_S
        while len(seen) < 10:
            assert time.monotonic() < deadline, f"the member read only {sorted(seen)} before the restart"
            seen.update(r.value or b"" for r in consumer.poll(timeout_ms=200))
        consumer.commit()
        last_poll = time.monotonic()
        with Admin(bootstrap) as admin:
            old_addresses = set(admin.nodes().values())

        # Every node restarted while the member does not poll: each comes back on other ports.
        for node in fresh_cluster.nodes.values():
            node.kill()
        for node in fresh_cluster.nodes.values():
            node.start()
        fresh_cluster.wait_for_nodes(list(fresh_cluster.nodes))
        wait_for_full_isr(bootstrap, topic)
        with Admin(bootstrap) as admin:
            new_addresses = set(admin.nodes().values())
        assert not old_addresses & new_addresses, "a node came back on its old port: this test needs new ones"
        with Producer(bootstrap) as producer:
            for i in range(10):
                producer.send(topic, b"after-%d" % i).result(timeout=30)
        # Past the member's session clock: its next poll drops its partitions as lost (it
        # fetches nothing from then on) and it must find the coordinator at a new address.
        time.sleep(max(0.0, last_poll + SESSION_TIMEOUT_MS / 1000 + 0.5 - time.monotonic()))

        wanted = {b"after-%d" % i for i in range(10)}
        got: set[bytes] = set()
        deadline = time.monotonic() + REJOIN_WAIT_S
        while not wanted <= got and time.monotonic() < deadline:
            got.update(r.value or b"" for r in consumer.poll(timeout_ms=200))
        assert wanted <= got, (f"the member did not rejoin within {REJOIN_WAIT_S} s after every node restarted "
                               f"on other ports: read {len(got & wanted)} of 10 new records")
    finally:
        consumer.close()

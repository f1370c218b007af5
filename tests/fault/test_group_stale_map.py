"""Consumers must find the nodes again after every node they knew moved.

Found by a randomized soak (node kills, pauses, ZooKeeper pauses): a group member dropped
its partitions on its session clock (no heartbeat answered for a session), so it fetched
nothing and nothing re-read its routing map; meanwhile every node restarted on another
port (LocalCluster, like `fabric node` with ``port = 0``, picks a free one each start).
Each heartbeat then asked FIND_COORDINATOR of the first address in its stale map, whose
connect wait (1 s) used up the heartbeat's whole budget, so the map was never re-read
(the refresh after the failed candidates was bounded by that spent budget) and the dead
address was never moved to the back. The members polled for 9 minutes without rejoining,
the group "empty" and its lag growing, until the soak killed them.

The same held for any consumer of a cluster of five or more nodes: a map re-read asks
the bootstrap only after two passes over the known addresses (0.1 s, then up to 1 s
each), and with five stale ones those passes outlast a poll's bound (its timeout plus
POLL_WORK_MS, 5 s), so a plain consumer and a queue consumer asked the same dead
addresses on every poll and never read again. Five nodes here, for that reason.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Consumer, Producer, QueueConsumer, TopicPartition
from tests.conftest import make_cluster
from tests.fault.harness import wait_for_full_isr

pytestmark = pytest.mark.slow

NODES = 5
SESSION_TIMEOUT_MS = 6_000
REJOIN_WAIT_S = 60.0
RECORDS = 10


@pytest.fixture
def five_nodes(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    c = make_cluster(zk_server, tmp_path / "cluster", nodes=NODES)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _produce(bootstrap: str, destinations: list[str], prefix: str) -> None:
    with Producer(bootstrap, acks="all") as producer:
        for destination in destinations:
            for i in range(RECORDS):
                producer.send(destination, b"%s-%d" % (prefix.encode(), i)).result(timeout=30)


def test_consumers_find_every_node_restarted_on_other_ports(five_nodes: LocalCluster) -> None:
    bootstrap, topic, queue, group = five_nodes.bootstrap, "stale-map", "stale-map-jobs", "stale-map-group"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync": 2})
        admin.create_queue(queue)
    _produce(bootstrap, [topic, queue], "before")
    member = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                      session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=1_000)
    plain = Consumer(bootstrap, auto_offset_reset="earliest")
    worker = QueueConsumer(bootstrap, queue, "workers")
    try:
        member.subscribe([topic])
        plain.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        before = {b"before-%d" % i for i in range(RECORDS)}
        seen_member: set[bytes] = set()
        seen_plain: set[bytes] = set()
        seen_worker: set[bytes] = set()
        deadline = time.monotonic() + REJOIN_WAIT_S
        while not (before <= seen_member and before <= seen_plain and before <= seen_worker):
            assert time.monotonic() < deadline, "the consumers did not read every record before the restart"
            seen_member.update(r.value or b"" for r in member.poll(timeout_ms=100))
            seen_plain.update(r.value or b"" for r in plain.poll(timeout_ms=100))
            got = worker.receive(10, 100)
            seen_worker.update(m.value or b"" for m in got)
            if got:
                worker.ack(got)
        member.commit()
        last_poll = time.monotonic()
        with Admin(bootstrap) as admin:
            old_addresses = set(admin.nodes().values())

        # Every node restarted while nobody polls: each comes back on other ports.
        for node in five_nodes.nodes.values():
            node.kill()
        for node in five_nodes.nodes.values():
            node.start()
        five_nodes.wait_for_nodes(list(five_nodes.nodes))
        wait_for_full_isr(bootstrap, topic)
        with Admin(bootstrap) as admin:
            new_addresses = set(admin.nodes().values())
        assert not old_addresses & new_addresses, "a node came back on its old port: this test needs new ones"
        _produce(bootstrap, [topic, queue], "after")
        # Past the member's session clock: its next poll drops its partitions as lost (it
        # fetches nothing from then on) and it must find the coordinator at a new address.
        time.sleep(max(0.0, last_poll + SESSION_TIMEOUT_MS / 1000 + 0.5 - time.monotonic()))

        wanted = {b"after-%d" % i for i in range(RECORDS)}
        got_member: set[bytes] = set()
        got_plain: set[bytes] = set()
        got_worker: set[bytes] = set()
        deadline = time.monotonic() + REJOIN_WAIT_S
        while time.monotonic() < deadline and not (wanted <= got_member and wanted <= got_plain
                                                    and wanted <= got_worker):
            if not wanted <= got_member:
                got_member.update(r.value or b"" for r in member.poll(timeout_ms=200))
            if not wanted <= got_plain:
                got_plain.update(r.value or b"" for r in plain.poll(timeout_ms=200))
            if not wanted <= got_worker:
                received = worker.receive(10, 200)
                got_worker.update(m.value or b"" for m in received)
                if received:
                    worker.ack(received)
        lagging = {name: len(got & wanted) for name, got in
                   (("group member", got_member), ("assigned consumer", got_plain), ("queue consumer", got_worker))
                   if not wanted <= got}
        assert not lagging, (f"within {REJOIN_WAIT_S} s after every node restarted on other ports, these read "
                             f"only so many of the {RECORDS} new records: {lagging}")
    finally:
        worker.close()
        plain.close()
        member.close()

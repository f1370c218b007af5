"""Consumers must find the nodes again after every node they knew moved.

Found by randomized soaks (node kills, pauses, ZooKeeper pauses, every node restarted on
other ports: LocalCluster, like `fabric node` with ``port = 0``, picks a free one each
start):

* A group member dropped its partitions on its session clock, so it fetched nothing and
  nothing re-read its routing map. Each heartbeat asked FIND_COORDINATOR of the first
  address in its stale map, whose connect wait (1 s) used up the heartbeat's budget, so
  the map was never re-read. Members polled for 9 minutes without rejoining.
* With five or more nodes any consumer was stuck: a map re-read asks the bootstrap only
  after two passes over the known addresses (0.1 s, then up to 1 s each), and five stale
  ones outlast a poll's bound (its timeout plus POLL_WORK_MS, 5 s). A plain consumer and a
  queue consumer asked the same dead addresses on every poll and never read again. Now
  the bootstrap is asked first once every known address has failed, at most every 2 s.
* With ZooKeeper paused while the nodes came back, that first bootstrap read returned the
  dead nodes' registrations (their sessions had not expired yet). Every later re-read's
  last pass, reached with no time left, counted as a bootstrap read too, so no re-read
  asked the bootstrap first again: members took about 34 s after ZooKeeper returned
  (until the dead addresses stopped counting as failed, 30 s), against about 7 s.

Five nodes and a ZooKeeper of its own (paused here) for those reasons.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Consumer, Producer, QueueConsumer, TopicPartition
from tests.fault.harness import wait_for_full_isr, wait_until

pytestmark = pytest.mark.slow

NODES = 5
SESSION_TIMEOUT_MS = 6_000
ZK_PAUSE_S = 8.0  # past the members' sessions: every one loses its partitions
# From ZooKeeper's return to every consumer reading again: about 7 s here, and about 34 s
# before the last fix above.
RESUME_WAIT_S = 20.0
RECORDS = 10


@pytest.fixture
def own_zookeeper(tmp_path: Path) -> Iterator[LocalZooKeeper]:
    zookeeper = LocalZooKeeper(tmp_path / "zk")
    zookeeper.start()
    try:
        yield zookeeper
    finally:
        zookeeper.resume()
        zookeeper.stop()


@pytest.fixture
def five_nodes(own_zookeeper: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(NODES, tmp_path / "cluster", zk_address=own_zookeeper.address, chroot="/stale-map")
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


class Reading(threading.Thread):
    """Polls one consumer all along, keeping every value it reads."""

    def __init__(self, name: str, poll: Callable[[], list[bytes]], close: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.poll, self.close = poll, close
        self.values: set[bytes] = set()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                self.values.update(self.poll())
        except BaseException as exc:  # surfaced by the test
            self.error = exc
        finally:
            self.close()


def test_consumers_find_every_node_restarted_on_other_ports(five_nodes: LocalCluster,
                                                           own_zookeeper: LocalZooKeeper) -> None:
    bootstrap, topic, queue, group = five_nodes.bootstrap, "stale-map", "stale-map-jobs", "stale-map-group"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3, config={"min_insync": 2})
        admin.create_queue(queue)
        old_addresses = set(admin.nodes().values())
    _produce(bootstrap, [topic, queue], "before")
    member = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                      session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=1_000)
    member.subscribe([topic])
    plain = Consumer(bootstrap, auto_offset_reset="earliest")
    plain.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    worker = QueueConsumer(bootstrap, queue, "workers")

    def receive() -> list[bytes]:
        got = worker.receive(10, 200)
        if got:
            worker.ack(got)
        return [m.value or b"" for m in got]

    readers = [Reading("group member", lambda: [r.value or b"" for r in member.poll(timeout_ms=200)], member.close),
               Reading("assigned consumer", lambda: [r.value or b"" for r in plain.poll(timeout_ms=200)], plain.close),
               Reading("queue consumer", receive, worker.close)]
    for reader in readers:
        reader.start()
    try:
        before = {b"before-%d" % i for i in range(RECORDS)}
        wait_until(lambda: all(before <= r.values for r in readers), "every consumer read the first records", 60)

        # Every node restarted (each on other ports) while ZooKeeper is paused: when it
        # returns it still lists the dead nodes for a moment, and the consumers poll all along.
        for node in five_nodes.nodes.values():
            node.kill()
        own_zookeeper.pause()
        try:
            for node in five_nodes.nodes.values():
                node.start()
            time.sleep(ZK_PAUSE_S)
        finally:
            own_zookeeper.resume()
        resumed_s = time.monotonic()
        five_nodes.wait_for_nodes(list(five_nodes.nodes))
        wait_for_full_isr(bootstrap, topic)
        with Admin(bootstrap) as admin:
            new_addresses = set(admin.nodes().values())
        assert not old_addresses & new_addresses, "a node came back on its old port: this test needs new ones"
        _produce(bootstrap, [topic, queue], "after")

        wanted = {b"after-%d" % i for i in range(RECORDS)}
        deadline = resumed_s + RESUME_WAIT_S
        while time.monotonic() < deadline and not all(wanted <= r.values for r in readers):
            time.sleep(0.1)
        lagging = {r.name: len(r.values & wanted) for r in readers if not wanted <= r.values}
        assert not lagging, (f"within {RESUME_WAIT_S} s after ZooKeeper returned and every node restarted on other "
                             f"ports, these read only so many of the {RECORDS} new records: {lagging}")
    finally:
        for reader in readers:
            reader.stop_flag.set()
        for reader in readers:
            reader.join(30)
    errors = {r.name: r.error for r in readers if r.error is not None}
    assert not errors, errors

"""Many lifecycles of each SDK object leave nothing behind: after creating, using once and
closing each kind again and again in one process (with ``with``, by ``close()`` twice and
from another thread, or by dropping it), this process's threads, file descriptors (ZeroMQ
sockets and their mailboxes, TCP connections) and ZooKeeper connections are back where
they started.

Found by such a sweep: an ``sdk.Client`` dropped without ``close()`` kept its loop thread,
kazoo's threads and its ZooKeeper session for good (five threads and seven descriptors
each); fifty of them in a loop took fifty sessions, and ZooKeeper refuses a host's 61st
connection (``maxClientCnxns``), the nodes' own included. It is now closed when collected.
And a Consumer, QueueConsumer or Admin dropped without ``close()`` left its sockets to
pyzmq's ``__del__``, which warns before it closes: where warnings are errors (``-W
error``, these tests) the close never ran, 8 descriptors lost per consumer. Their
connections now close their sockets when collected (fabric/transport.py).
The sweep of the issue ran 200 lifecycles per kind; these run a dozen, enough to see any
per-lifecycle leak, within the suite's time.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

import sdk
from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Consumer, OrderedConsumer, Producer, QueueConsumer, TopicPartition
from tests.conftest import make_cluster

LIFECYCLES = 12  # per kind: a leak of one thread or descriptor per lifecycle shows a dozen
WARM_UP_LIFECYCLES = 2  # the first ones create what a process keeps (zmq's context and its threads)
SETTLE_TIMEOUT_S = 15.0  # ZeroMQ closes sockets on its reaper thread, kazoo's threads end a moment after close
SETTLE_POLL_S = 0.05
TOPIC = "leaks"
ORDERED_TOPIC = "leaks-ordered"
QUEUE = "leaks-queue"
SERVICE = "leaks-echo"
REQUEST_TIMEOUT_MS = 10_000
RESULT_TIMEOUT_S = 30.0
TCP_ESTABLISHED = "01"


@pytest.fixture(scope="module")
def leak_cluster(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes and a sequencer (for the strict-order topic) shared by this module."""
    cluster = make_cluster(zk_server, tmp_path_factory.mktemp("leaks"), sequencer_count=1)
    cluster.start()
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=2)
            admin.create_topic(ORDERED_TOPIC, partitions=2, strict_order=True)
            admin.create_queue(QUEUE, partitions=2)
        with Producer(cluster.bootstrap) as producer:
            for i in range(10):
                producer.send(TOPIC, b"record-%d" % i)
                producer.send(ORDERED_TOPIC, b"ordered-%d" % i)
                producer.send(QUEUE, b"job-%d" % i)
            producer.flush(RESULT_TIMEOUT_S)
        yield cluster
    finally:
        cluster.stop()


@dataclass(frozen=True)
class Footprint:
    threads: int
    descriptors: int
    zookeeper_connections: int

    def within(self, baseline: Footprint) -> bool:
        return (self.threads <= baseline.threads and self.descriptors <= baseline.descriptors
                and self.zookeeper_connections <= baseline.zookeeper_connections)


def zookeeper_connections(port: int) -> int:
    """This process's established TCP connections to ``port`` (its ZooKeeper sessions)."""
    inodes: set[str] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if remote_port == port and fields[3] == TCP_ESTABLISHED and fields[9] in inodes:
                    count += 1
    return count


def footprint(zk_port: int) -> Footprint:
    gc.collect()  # what nothing references any more goes now (a dropped object's finalizer runs)
    return Footprint(threading.active_count(), len(os.listdir("/proc/self/fd")), zookeeper_connections(zk_port))


def settled(baseline: Footprint, zk_port: int) -> Footprint:
    """The footprint once it is back within ``baseline``, or as it is after SETTLE_TIMEOUT_S."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        now = footprint(zk_port)
        if now.within(baseline) or time.monotonic() > deadline:
            return now
        time.sleep(SETTLE_POLL_S)


def producer_with(bootstrap: str) -> None:
    with Producer(bootstrap, linger_ms=0) as producer:
        producer.send(TOPIC, b"v").result(timeout=RESULT_TIMEOUT_S)


def producer_dropped(bootstrap: str) -> None:
    producer = Producer(bootstrap, linger_ms=0)
    producer.send(TOPIC, b"v").result(timeout=RESULT_TIMEOUT_S)
    del producer  # collected: flushes and stops its sender thread


def producer_closed_twice_from_two_threads(bootstrap: str) -> None:
    producer = Producer(bootstrap, linger_ms=0)
    producer.send(TOPIC, b"v").result(timeout=RESULT_TIMEOUT_S)
    other = threading.Thread(target=producer.close)
    other.start()
    producer.close()
    other.join(RESULT_TIMEOUT_S)
    producer.close()


def consumer_assigned(bootstrap: str) -> None:
    with Consumer(bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
        consumer.seek_to_beginning()
        consumer.poll(timeout_ms=100)


def consumer_dropped(bootstrap: str) -> None:
    consumer = Consumer(bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    consumer.assign([TopicPartition(TOPIC, 0)])
    consumer.poll(timeout_ms=50)
    del consumer


def consumer_in_a_group(bootstrap: str) -> None:
    consumer = Consumer(bootstrap, group_id="leaks-group", request_timeout_ms=REQUEST_TIMEOUT_MS)
    with consumer:
        consumer.subscribe([TOPIC])
        consumer.poll(timeout_ms=100)
    consumer.close()  # a second close does nothing


def queue_consumer(bootstrap: str) -> None:
    with QueueConsumer(bootstrap, QUEUE) as worker:
        worker.receive(1, 0)  # anything received and not acked is given back by the close


def queue_consumer_dropped(bootstrap: str) -> None:
    worker = QueueConsumer(bootstrap, QUEUE)
    worker.receive(1, 0)
    del worker  # its leases end on their own; its sockets close when it is collected


def ordered_consumer(bootstrap: str) -> None:
    with OrderedConsumer(bootstrap, ORDERED_TOPIC) as reader:
        reader.poll(timeout_ms=50)


def admin(bootstrap: str) -> None:
    with Admin(bootstrap) as client:
        client.describe_topic(TOPIC)


def admin_dropped(bootstrap: str) -> None:
    client = Admin(bootstrap)
    client.list_topics()
    del client


def asyncio_client(bootstrap: str) -> None:
    async def run() -> None:
        async with await sdk.connect(bootstrap) as client:
            await client.producer(linger_ms=0).send(TOPIC, b"v")
            consumer = await client.consumer([TOPIC])
            await consumer.poll(50)
            worker = await client.queue_consumer(QUEUE)
            await worker.receive(1, 0)

    asyncio.run(run())


def asyncio_direct(bootstrap: str) -> None:
    async def run() -> None:
        async with await sdk.connect(bootstrap) as client:
            await client.serve(SERVICE, lambda request: request.payload)
            await client.request(SERVICE, b"x", timeout_ms=REQUEST_TIMEOUT_MS)
            await client.subscribe("leaks.>")
            await client.publish("leaks.a", b"x")

    asyncio.run(run())


def blocking_client(bootstrap: str) -> None:
    with sdk.Client(bootstrap) as client:
        client.serve(SERVICE, lambda request: request.payload)
        client.request(SERVICE, b"x", timeout_ms=REQUEST_TIMEOUT_MS)
        subscription = client.subscribe("leaks.>")
        client.publish("leaks.a", b"x")
        subscription.next(timeout_ms=50)


def blocking_client_dropped(bootstrap: str) -> None:
    client = sdk.Client(bootstrap)
    client.services()
    del client  # collected: closed, its loop thread and ZooKeeper session gone


KINDS: dict[str, Callable[[str], None]] = {f.__name__: f for f in (
    producer_with, producer_dropped, producer_closed_twice_from_two_threads, consumer_assigned, consumer_dropped,
    consumer_in_a_group, queue_consumer, queue_consumer_dropped, ordered_consumer, admin, admin_dropped,
    asyncio_client, asyncio_direct, blocking_client, blocking_client_dropped)}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_lifecycles_leave_nothing_behind(leak_cluster: LocalCluster, kind: str) -> None:
    lifecycle = KINDS[kind]
    zk_port = int(leak_cluster.zk_address.split("/", 1)[0].rsplit(":", 1)[1])  # host:port/chroot
    for _ in range(WARM_UP_LIFECYCLES):
        lifecycle(leak_cluster.bootstrap)
    baseline = settled(footprint(zk_port), zk_port)
    for _ in range(LIFECYCLES):
        lifecycle(leak_cluster.bootstrap)
    after = settled(baseline, zk_port)
    assert after.within(baseline), (
        f"{LIFECYCLES} lifecycles of {kind} left {after} (baseline {baseline}); threads now: "
        f"{sorted(t.name for t in threading.enumerate())}")

"""A client of a cluster that is down reads the bootstrap at most every 2 s.

Found by a randomized soak (every node killed for longer than its ZooKeeper session):
once every node's registration had expired, ZooKeeper listed no node, the client's map
was replaced by that empty list, and from then on every metadata refresh found no address
to ask and read the bootstrap again, up to three times a refresh (the list of candidates
of two passes, then the rediscovery pass), none of them bounded by
REDISCOVER_INTERVAL_S: each poll of a consumer and each retry of a producer opened a
ZooKeeper session of its own, over 400 in 11 s from one soak process (docs/DESIGN.md:
"a cluster that is down, not moved, does not cost a ZooKeeper session per poll").
Counted here with ZooKeeper's own ``mntr`` (packets received), no mock.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from fabric.local import LocalZooKeeper
from sdk import Admin, Consumer, Producer, TopicPartition
from sdk._client import Bootstrap
from tests.conftest import make_cluster
from tests.fault.harness import wait_until

pytestmark = pytest.mark.slow

WATCH_S = 4.0
# A bootstrap read is a handful of packets (connect, exists, get_children, close, a
# ping); at most every 2 s over WATCH_S is three reads. The bug cost hundreds.
PACKETS_MAX = 60


def packets_received(address: str) -> int:
    host, _, port = address.partition(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"mntr")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    for line in data.decode().splitlines():
        key, _, value = line.partition("\t")
        if key == "zk_packets_received":
            return int(value)
    raise AssertionError(f"no zk_packets_received in mntr: {data[:200]!r}")


def test_down_cluster_costs_no_zookeeper_session_per_poll(zk_server: LocalZooKeeper, tmp_path: Path) -> None:
    cluster = make_cluster(zk_server, tmp_path / "cluster", nodes=1, session_timeout_ms=4_000)
    cluster.start()
    try:
        bootstrap = cluster.bootstrap
        with Admin(bootstrap) as admin:
            admin.create_topic("down", partitions=1, replication_factor=1)
        with Producer(bootstrap, acks="all") as producer:
            producer.send("down", b"v").result(timeout=30)
        with Consumer(bootstrap, fetch_max_wait_ms=100) as consumer:
            tp = TopicPartition("down", 0)
            consumer.assign([tp])
            consumer.seek_to_beginning()
            got: list[bytes] = []
            wait_until(lambda: bool(got.extend(r.value or b"" for r in consumer.poll(200))) or bool(got),
                       "the record is read", timeout_s=30)
            cluster.nodes[1].kill()
            # Its registration expires with its session: ZooKeeper then lists no node.
            wait_until(lambda: Bootstrap(bootstrap).node_addresses() == [], "no node registered", timeout_s=30)
            end = time.monotonic() + 2.0
            while time.monotonic() < end:  # the client learns that the cluster is empty
                consumer.poll(200)
            before = packets_received(zk_server.address)
            end = time.monotonic() + WATCH_S
            while time.monotonic() < end:
                assert consumer.poll(200) == []
            spent = packets_received(zk_server.address) - before
            print(f"{spent} ZooKeeper packets in {WATCH_S} s of polling a down cluster")
            assert spent <= PACKETS_MAX, f"{spent} ZooKeeper packets in {WATCH_S} s of polling a down cluster"
            cluster.nodes[1].start()
            cluster.wait_for_nodes([1])
            # And it finds the node again (on its new port) once it is back.
            fresh = Producer(bootstrap, acks="all")
            try:
                fresh.send("down", b"w").result(timeout=30)
            finally:
                fresh.close()
            wait_until(lambda: bool(got.extend(r.value or b"" for r in consumer.poll(200))) or b"w" in got,
                       "the consumer reads again after the node came back", timeout_s=30)
    finally:
        cluster.stop()

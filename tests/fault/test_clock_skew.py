"""Wall clocks that differ between processes, on real nodes under libfaketime (LD_PRELOAD,
as tests/fault/test_failover.py's test_skewed_wall_clocks_change_nothing): node 1 on the
real clock, node 2 three hours behind, node 3 two days ahead; the test process (producer,
worker) on the real clock, sending records stamped a day early or late as a producer with
a wrong clock does. The rules they check: docs/DESIGN.md, "Clocks".

One cluster for the module: the retention test, which restarts node 3 with its clock
moved on, comes last."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Producer, QueueConsumer, QueueMessage
from tests.conftest import make_cluster
from tests.fault.harness import NODE_ARGS, leader_of, wait_for_full_isr, wait_until

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(LIBFAKETIME).exists(), reason="faketime is not installed (scripts/install.sh installs it)")]

SKEWS: dict[int, str | None] = {1: None, 2: "-3h", 3: "+2d"}
DAY_MS = 86_400_000
GROUP = "workers"
RETENTION_CHECK_MS = 200


def _clock(skew: str | None) -> dict[str, str] | None:
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": skew} if skew else None


@pytest.fixture(scope="module")
def skewed(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path_factory.mktemp("skewed"), nodes=0,
                           node_args=[*NODE_ARGS, "--retention-check-interval-ms", str(RETENTION_CHECK_MS)])
    with cluster:
        for node_id, skew in SKEWS.items():
            cluster.add_node(node_id, wait=False, env=_clock(skew))
        cluster.wait_for_nodes(list(SKEWS))
        yield cluster


def _lead(bootstrap: str, topic: str, node_id: int) -> None:
    """Move partition 0's leadership to ``node_id`` (a graceful change: the queue's state
    is loaded by the new leader as after a failover, its leases dropped)."""
    replicas = [node_id, *(n for n in SKEWS if n != node_id)]
    with Admin(bootstrap) as admin:
        admin.reassign_partition(topic, 0, replicas)
        admin.wait_reassigned(topic, 0, replicas)
        admin.elect_preferred_leaders([topic])
    wait_until(lambda: leader_of(bootstrap, topic, 0) == node_id, f"node {node_id} to lead {topic}")


def _counts(bootstrap: str, queue: str) -> dict[str, int]:
    with Admin(bootstrap) as admin:
        p = admin.describe_queue(queue, GROUP, timeout_s=30).partitions[0]  # waits for the new leader's load
    return {"visible": p.visible, "delayed": p.delayed, "in_flight": p.in_flight, "dropped": p.dropped,
            "deduplicated": p.deduplicated}


def _receive(worker: QueueConsumer, wanted: set[bytes], timeout_s: float = 20.0) -> dict[bytes, QueueMessage]:
    got: dict[bytes, QueueMessage] = {}
    deadline = time.monotonic() + timeout_s
    while not wanted <= set(got) and time.monotonic() < deadline:
        for m in worker.receive(10, 500):
            assert m.value is not None
            got[m.value] = m
    return got


def test_queue_times_follow_the_leaders_clock(skewed: LocalCluster, topic_name: str) -> None:
    """Delays, TTLs and dedup windows count from the leader's append, not the producer's
    timestamp; a new leader reads the old one's times on its own clock; a worker reads its
    leases against the leader's clock. Before: the record stamped a day early expired at
    once (its 60 s TTL), the one stamped a day late stayed delayed a day, the repeat of a
    dedup id was delivered; on node 3 (2 days ahead) a 10 min delay ended at once, a 1 h
    TTL had passed, a 10 min nack delay had ended and the group, idle for 2 days by node
    3's reading, was deleted under its 1-day retention; on node 2 (3 h behind) a nacked
    message stayed hidden 3 h, and this process, 3 h ahead of node 2, dropped every lease
    it got as already over."""
    bootstrap, queue = skewed.bootstrap, topic_name
    with Admin(bootstrap) as admin:
        admin.create_queue(queue, partitions=1, group_retention_ms=DAY_MS)
    _lead(bootstrap, queue, 1)
    now_ms = int(time.time() * 1000)
    with Producer(bootstrap, linger_ms=1) as producer:
        for f in [producer.send(queue, b"ttl, stamped a day early", ttl_ms=60_000, timestamp_ms=now_ms - DAY_MS),
                  producer.send(queue, b"delay, stamped a day late", delay_ms=1_000, timestamp_ms=now_ms + DAY_MS),
                  producer.send(queue, b"order-17", dedup_id="order-17", timestamp_ms=now_ms - DAY_MS),
                  producer.send(queue, b"order-17 again", dedup_id="order-17"),
                  producer.send(queue, b"nack at once"), producer.send(queue, b"nack for 10 min")]:
            f.result(timeout=30)
    wanted = {b"ttl, stamped a day early", b"delay, stamped a day late", b"order-17", b"nack at once",
              b"nack for 10 min"}
    with QueueConsumer(bootstrap, queue, GROUP) as worker:
        got = _receive(worker, wanted)
        assert set(got) == wanted  # "order-17 again" is a repeat: accepted and dropped
        worker.ack([got[v] for v in (b"ttl, stamped a day early", b"delay, stamped a day late", b"order-17")])
        worker.nack(got[b"nack at once"])
        worker.nack(got[b"nack for 10 min"], delay_ms=600_000)
    with Producer(bootstrap, linger_ms=1) as producer:
        producer.send(queue, b"delay 10 min", delay_ms=600_000).result(timeout=30)
        producer.send(queue, b"ttl 1 h", ttl_ms=3_600_000).result(timeout=30)
    # visible: "nack at once", "ttl 1 h"; delayed: "nack for 10 min", "delay 10 min".
    expected = {"visible": 2, "delayed": 2, "in_flight": 0, "dropped": 0, "deduplicated": 1}
    assert _counts(bootstrap, queue) == expected
    for node_id in (3, 2):  # two days ahead, then three hours behind
        _lead(bootstrap, queue, node_id)
        assert _counts(bootstrap, queue) == expected, f"led by node {node_id} ({SKEWS[node_id]})"
        time.sleep(1.5)  # the leader's idle-group check runs about once a second
        with Admin(bootstrap) as admin:
            assert GROUP in admin.describe_queue_groups(queue, timeout_s=30), f"node {node_id} deleted the group as idle"
    with QueueConsumer(bootstrap, queue, GROUP) as worker:  # this process is 3 h ahead of node 2
        got = _receive(worker, {b"nack at once", b"ttl 1 h"})
        assert set(got) == {b"nack at once", b"ttl 1 h"}
        worker.ack(list(got.values()))


def test_a_follower_whose_clock_jumps_keeps_what_its_leader_serves(skewed: LocalCluster, topic_name: str) -> None:
    """Age-based retention is the leader's alone. Node 3, two days ahead, follows a topic
    kept one day; restarted with its clock two more days on, it read every batch it had
    appended as two days old and deleted all of them while the leader still served them
    (its copy, needed after a failover, gone). Followers now delete only below their
    leader's log start. Runs last: node 3 keeps its new clock."""
    bootstrap, topic = skewed.bootstrap, topic_name
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"retention_ms": DAY_MS})
    _lead(bootstrap, topic, 1)
    with Producer(bootstrap, linger_ms=1) as producer:
        for f in [producer.send(topic, b"r%d" % i) for i in range(20)]:
            f.result(timeout=30)
    wait_for_full_isr(bootstrap, topic)

    def starts() -> dict[int, int]:
        with Admin(bootstrap) as admin:
            rows = admin.describe_replicas([topic])[(topic, 0)]
        return {row["node_id"]: row["log_start_offset"] for row in rows}

    time.sleep(3 * RETENTION_CHECK_MS / 1000)
    assert starts() == {1: 0, 2: 0, 3: 0}  # a steady skew changes nothing: each dates its own copy
    skewed.nodes[3].kill()
    skewed.add_node(3, env=_clock("+4d"))
    wait_for_full_isr(bootstrap, topic)
    time.sleep(5 * RETENTION_CHECK_MS / 1000)  # several retention checks on node 3
    assert starts() == {1: 0, 2: 0, 3: 0}

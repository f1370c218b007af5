"""Consumer groups across a ZooKeeper restart: coordination is a data-path duty within the
node's lease (nodes/state.py ``may_coordinate``), not a metadata one. A fault audit saw a
one-second ZooKeeper restart stop every group for 40 s: each coordinator dropped its groups
the moment the connection went, and every member's commit waited out its 30 s timeout."""

from __future__ import annotations

import time
from pathlib import Path

from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition

SESSION_TIMEOUT_MS = 10_000  # a lease of 8 s: the restart below fits well inside it


def test_a_group_commits_and_reads_while_zookeeper_restarts(tmp_path: Path, topic_name: str) -> None:
    # Its own ZooKeeper, because the test kills it.
    cluster = LocalCluster(3, tmp_path / "cluster", session_timeout_ms=SESSION_TIMEOUT_MS)
    with cluster:
        bootstrap, topic = cluster.bootstrap, topic_name
        with Admin(bootstrap) as admin:
            admin.create_topic(topic, partitions=2, replication_factor=3)
        with Producer(bootstrap, linger_ms=1) as producer:
            for i in range(200):
                producer.send(topic, b"v%d" % i, partition=i % 2)
            producer.flush(30)
        read = 0
        with Consumer(bootstrap, group_id=f"g-{topic}", enable_auto_commit=False, session_timeout_ms=10_000,
                      heartbeat_interval_ms=500, request_timeout_ms=5_000) as consumer:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 30
            while read < 100 and time.monotonic() < deadline:
                read += len(consumer.poll(timeout_ms=200, max_records=50))
            consumer.commit()
            assert cluster.zookeeper is not None
            cluster.zookeeper.kill()
            try:
                time.sleep(0.5)  # every node has lost its connection
                began = time.monotonic()
                while read < 200 and time.monotonic() - began < 3:
                    read += len(consumer.poll(timeout_ms=200, max_records=50))
                consumer.commit()  # answered by the coordinator, ZooKeeper or not
                committed_s = time.monotonic() - began
            finally:
                cluster.zookeeper.start()
            assert read == 200
            assert committed_s < 4, f"the commit took {committed_s:.1f} s without ZooKeeper"
            assert sum(consumer.committed(TopicPartition(topic, p)) or 0 for p in range(2)) == 200
        logs = "".join((tmp_path / "cluster" / f"node{n}.log").read_text(errors="replace") for n in cluster.nodes)
        assert "stopped coordinating" not in logs

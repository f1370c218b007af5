"""Restart without loss, retention in the background, the CLI end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Consumer, Producer, TopicPartition
from tests.conftest import make_cluster
from tests.integration.helpers import leader_id, read_all


def test_sigkill_restart_serves_everything_acknowledged(fresh_cluster: LocalCluster, topic_name: str) -> None:
    with Admin(fresh_cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    victim = fresh_cluster.nodes[leader_id(fresh_cluster.bootstrap, topic_name)]
    acknowledged = []
    with Producer(fresh_cluster.bootstrap, acks=1, linger_ms=1) as producer:
        futures = [producer.send(topic_name, b"m%d" % i) for i in range(20_000)]
        producer.flush(30)
        acknowledged = [(f.result(0).offset, b"m%d" % i) for i, f in enumerate(futures)]
    victim.kill()  # SIGKILL: no flush, no clean close; only RocksDB's WAL stands between us and loss
    victim.start()
    fresh_cluster.wait_for_nodes([victim.node_id])
    records = read_all(fresh_cluster.bootstrap, topic_name, 1, expected=len(acknowledged), timeout_s=60)
    assert [(r.offset, r.value) for r in records] == acknowledged
    # And it takes new writes after the old ones.
    with Producer(fresh_cluster.bootstrap) as producer:
        assert producer.send(topic_name, b"after").result(30).offset == len(acknowledged)


def test_retention_by_bytes_and_time(zk_server: LocalZooKeeper, tmp_path: Path, topic_name: str) -> None:
    cluster = make_cluster(zk_server, tmp_path / "c", nodes=1, node_args=["--retention-check-interval-ms", "100"])
    with cluster:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(topic_name, partitions=1, replication_factor=1, config={"retention_bytes": 20_000})
            admin.create_topic(topic_name + "-t", partitions=1, replication_factor=1, config={"retention_ms": 300})
        with Producer(cluster.bootstrap, linger_ms=0, compression="none") as producer:
            for _i in range(100):
                producer.send(topic_name, b"x" * 1_000).result(10)  # one ~1 KB batch each
            producer.send(topic_name + "-t", b"short-lived").result(10)
        tp = TopicPartition(topic_name, 0)
        tpt = TopicPartition(topic_name + "-t", 0)
        with Consumer(cluster.bootstrap) as consumer:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                starts = consumer.beginning_offsets([tp, tpt])
                if starts[tp] >= 75 and starts[tpt] == 1:
                    break
                time.sleep(0.1)
            assert starts[tp] >= 75, starts  # about 20 KB of 1 KB batches is left
            assert starts[tpt] == 1  # the one record aged out
            assert consumer.end_offsets([tp])[tp] == 100
            # A consumer positioned below the new start is reset to it, not stuck.
            consumer.assign([tp])
            consumer.seek(tp, 0)
            records = consumer.poll(timeout_ms=5_000, max_records=1)
            assert records and records[0].offset == starts[tp]


def test_cli_topic_produce_consume(cluster: LocalCluster, topic_name: str, tmp_path: Path) -> None:
    env = {**os.environ, "FABRIC_BOOTSTRAP": cluster.bootstrap, "FABRIC_HOME": str(tmp_path)}

    def fabric(*args: str, stdin: bytes | None = None) -> str:
        done = subprocess.run([sys.executable, "-m", "fabric.cli", *args], input=stdin, env=env,
                              capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    assert "created topic" in fabric("topic", "create", topic_name, "--partitions", "2", "-c", "retention_ms=3600000")
    assert topic_name in fabric("topic", "list")
    assert "retention_ms = 3600000" in fabric("topic", "describe", topic_name)
    lines = b"".join(b"k%d\tline %d\n" % (i % 3, i) for i in range(1_000))
    fabric("produce", topic_name, "--key-sep", "\t", stdin=lines)
    out = fabric("consume", topic_name, "--print-key")
    got = sorted(out.splitlines())
    assert got == sorted(f"k{i % 3}\tline {i}" for i in range(1_000))
    assert len(fabric("consume", topic_name, "--max-messages", "5").splitlines()) == 5
    fabric("topic", "delete", topic_name)
    assert topic_name not in fabric("topic", "list")


def test_read_all_helper_sees_nothing_in_an_empty_topic(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    assert read_all(cluster.bootstrap, topic_name, 2) == []


def test_a_replica_that_copied_late_deletes_what_the_leaders_retention_deleted(
        zk_server: LocalZooKeeper, tmp_path: Path, topic_name: str) -> None:
    """Retention counts from when a replica appended a batch; a replica added by a
    reassignment appended old batches late and kept them that much longer (here 4 s), so a
    leader change onto it brought deleted records back (the log start went backwards).
    Followers now delete below the leader's log start, which the answer to their periodic
    ack (every 100 ms) carries."""
    cluster = make_cluster(zk_server, tmp_path / "c", nodes=4, node_args=["--retention-check-interval-ms", "100"])
    with cluster, Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3, config={"retention_ms": 8_000})
        replicas = list(admin.describe_topic(topic_name).partitions[0].replicas)
        with Producer(cluster.bootstrap, linger_ms=0) as producer:
            for i in range(50):
                producer.send(topic_name, b"r%d" % i).result(10)
        time.sleep(4.0)  # half the retention: the newcomer copies batches 4 s old
        newcomer = next(n for n in sorted(cluster.nodes) if n not in replicas)
        target = [replicas[0], replicas[1], newcomer]
        admin.reassign_partition(topic_name, 0, target)
        admin.wait_reassigned(topic_name, 0, target, timeout_s=60)

        def starts() -> dict[int, int]:
            return {c["node_id"]: c["log_start_offset"] for c in admin.describe_replicas([topic_name])[(topic_name, 0)]}

        deadline = time.monotonic() + 30
        while starts().get(replicas[0], 0) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert starts()[replicas[0]] == 50  # the leader's retention ran
        # Within a few acks the others follow (before: the newcomer 4 s later).
        deadline = time.monotonic() + 2.5
        seen = starts()
        while any(s != 50 for s in seen.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = starts()
        assert seen == {n: 50 for n in target}, seen

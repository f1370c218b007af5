"""Partition reassignment on real processes: a fourth node joins, ``fabric topic reassign``
moves a partition (its leader included) onto it under acks=all load with a catch-up
throttle, the history checker finds nothing lost, and the data is on the new node and
gone from the removed one."""

from __future__ import annotations

import os
import time

from fabric.local import LocalCluster
from sdk import Admin, Producer
from tests.fault.harness import Reader, Writer, collect_replicas, read_everything, wait_for_full_isr
from tests.fault.history import History, check
from tests.integration.test_status import fabric

PARTITIONS = 2
PRELOAD_RECORDS = 2_000
PRELOAD_VALUE_BYTES = 1_000  # ~2 MB to copy, so the throttled catch-up can be watched
THROTTLE_BYTES_PER_S = 500_000
RATE_PER_S = 300
NEW_NODE = 4


def test_reassign_moves_a_partition_to_a_new_node_under_load(fresh_cluster: LocalCluster, topic_name: str) -> None:
    cluster, topic = fresh_cluster, topic_name
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3, config={"min_insync": 2})
    history = History()
    with Producer(cluster.bootstrap, acks="all", linger_ms=5) as producer:
        futures = []
        for i in range(PRELOAD_RECORDS):
            value = b"pre-%06d-" % i + os.urandom(PRELOAD_VALUE_BYTES)  # incompressible
            history.record_sent(value)
            futures.append((value, producer.send(topic, value, partition=0)))
        producer.flush(60)
        for value, future in futures:
            meta = future.result(30)
            history.record_ack(value, meta.partition, meta.offset)
    cluster.add_node(NEW_NODE)
    writer = Writer(cluster.bootstrap, topic, history, count=10**9, rate_per_s=RATE_PER_S)
    reader = Reader(cluster.bootstrap, topic, PARTITIONS, history)
    writer.start()
    reader.start()
    try:
        time.sleep(1.0)
        with Admin(cluster.bootstrap) as admin:
            before = admin.describe_topic(topic).partitions[0]
        # The leader is the one replaced, so leadership has to move too.
        target = [NEW_NODE, *[r for r in before.replicas if r != before.leader]]
        began = time.monotonic()
        result = fabric("topic", "reassign", topic, "--partition", "0", "--replicas", ",".join(map(str, target)),
                        "--throttle-bytes-per-s", str(THROTTLE_BYTES_PER_S), "-b", cluster.bootstrap)
        assert result.returncode == 0, result.stderr
        assert f"moving {topic}/0 to replicas {target}" in result.stdout
        seen_moving = False
        while True:
            described = fabric("topic", "describe", topic, "-b", cluster.bootstrap)
            assert described.returncode == 0, described.stderr
            seen_moving = seen_moving or f"reassigning: adding [{NEW_NODE}]" in described.stdout
            with Admin(cluster.bootstrap) as admin:
                now = admin.describe_topic(topic).partitions[0]
            if tuple(now.replicas) == tuple(target) and NEW_NODE in now.isr:
                break
            assert time.monotonic() - began < 120, described.stdout
            time.sleep(0.2)
        moved_s = time.monotonic() - began
        assert seen_moving, f"describe never showed the move in progress ({moved_s:.1f} s)"
        assert now.leader != before.leader and now.leader in target
        assert set(now.isr) <= set(target)
        time.sleep(1.0)  # writes continue on the new replica set
    finally:
        writer.stop_flag.set()
        writer.join(timeout=240)
    assert writer.error is None, repr(writer.error)
    wait_for_full_isr(cluster.bootstrap, topic)
    described = fabric("topic", "describe", topic, "-b", cluster.bootstrap)
    assert "reassigning" not in described.stdout
    assert f"log 0..{PRELOAD_RECORDS}" not in described.stdout and "MiB)" in described.stdout, described.stdout
    read_everything(cluster.bootstrap, topic, PARTITIONS, history)
    reader.stop_flag.set()
    reader.join(timeout=30)
    assert reader.error is None, repr(reader.error)
    time.sleep(1.0)  # followers ack their last batches, the removed node wipes its copy
    collect_replicas(cluster, topic, PARTITIONS, history)
    report = check(history)
    copied = len(history.replicas[NEW_NODE].get(0, {}))
    print(f"reassigned {topic}/0 {list(before.replicas)} -> {target} in {moved_s:.1f} s "
          f"(throttle {THROTTLE_BYTES_PER_S} B/s, ~{PRELOAD_RECORDS * PRELOAD_VALUE_BYTES // 1000} kB preloaded): "
          f"{report.summary()}")
    assert report.ok(), report.summary()
    assert not report.lost and report.acked > PRELOAD_RECORDS
    assert copied > 0, "the new node holds none of the partition"
    assert not history.replicas[before.leader].get(0), "the removed replica still holds its copy"

"""Partition reassignment on real processes: a fourth node joins, ``fabric topic reassign``
moves a partition (its leader included) onto it under acks=all load with a catch-up
throttle, the history checker finds nothing lost, and the data is on the new node and
gone from the removed one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fabric.local import LocalCluster
from sdk import Admin, Producer
from tests.fault.harness import (
    Reader,
    Writer,
    collect_replicas,
    read_everything,
    wait_for_full_isr,
    wait_until,
)
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
        # fabric status shows the move, and does not count the copying replica as missing.
        status = fabric("status", "--json", "--no-groups", "-b", cluster.bootstrap)
        report_json = json.loads(status.stdout)
        moving_rows = [r for r in report_json["reassigning_partitions"] if r["topic"] == topic]
        seen_moving = bool(moving_rows)
        if seen_moving:
            assert moving_rows[0]["adding"] == [NEW_NODE], moving_rows
            assert not [r for r in report_json["under_replicated_partitions"] if r["topic"] == topic], report_json
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
        assert seen_moving, f"neither status nor describe showed the move in progress ({moved_s:.1f} s)"
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


def test_plans_bad_input_a_second_move_and_a_new_throttle(cluster: LocalCluster, topic_name: str,
                                                           tmp_path: Path) -> None:
    topic = topic_name
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=2, config={"min_insync": 1})
        parts = admin.describe_topic(topic).partitions
    with Producer(cluster.bootstrap, acks="all") as producer:
        for _ in range(300):  # ~300 kB of incompressible data in partition 0
            producer.send(topic, os.urandom(1_000), partition=0)
        producer.flush(30)
    # --generate proposes a plan and moves nothing: none over the nodes it was created on.
    same = fabric("topic", "reassign", topic, "--generate", "1,2,3", "-b", cluster.bootstrap)
    assert same.returncode == 0 and json.loads(same.stdout) == {"partitions": []}, same.stdout + same.stderr
    two = json.loads(fabric("topic", "reassign", topic, "--generate", "1,2", "-b", cluster.bootstrap).stdout)
    assert all(set(m["replicas"]) == {1, 2} for m in two["partitions"])
    assert all(m["replicas"] != list(parts[m["partition"]].replicas) for m in two["partitions"])  # only real moves
    # Bad input: one clear line each, nothing changed.
    unknown = fabric("topic", "reassign", topic, "--partition", "0", "--replicas", "1,9", "-b", cluster.bootstrap)
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert "[9] are not registered nodes" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    unknown = fabric("topic", "reassign", topic, "--generate", "1,9", "-b", cluster.bootstrap)  # printed a plan before
    assert unknown.returncode == 1 and not unknown.stdout, unknown.stdout
    assert "node 9 is not registered" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    bad_plan = tmp_path / "bad.json"
    bad_plan.write_text('{"partitions": [{"topic": "x"}]}')
    result = fabric("topic", "reassign", "--plan", str(bad_plan), "-b", cluster.bootstrap)
    assert result.returncode == 1 and "entry 0 needs topic" in result.stderr and "Traceback" not in result.stderr
    with Admin(cluster.bootstrap) as admin:
        assert admin.describe_topic(topic).partitions == parts

    # Partition 0 gains its third node at a crawl (1 kB/s: minutes for 300 kB).
    p0 = parts[0]
    third = next(n for n in cluster.nodes if n not in p0.replicas)
    slow = [*p0.replicas, third]
    assert fabric("topic", "reassign", topic, "--partition", "0", "--replicas", ",".join(map(str, slow)),
                  "--throttle-bytes-per-s", "1024", "-b", cluster.bootstrap).returncode == 0
    other = fabric("topic", "reassign", topic, "--partition", "0", "--replicas", str(third), "-b", cluster.bootstrap)
    assert other.returncode == 1 and "REASSIGNMENT_IN_PROGRESS" in other.stderr, other.stderr
    # Cancelled: the old replicas stay, the new one's partial copy goes.
    cancelled = fabric("topic", "reassign", topic, "--partition", "0", "--cancel", "-b", cluster.bootstrap)
    assert cancelled.returncode == 0, cancelled.stderr
    with Admin(cluster.bootstrap) as admin:
        back = admin.describe_topic(topic).partitions[0]
        assert set(back.replicas) == set(p0.replicas) and back.leader == p0.leader
        wait_until(lambda: third not in {r["node_id"] for r in admin.describe_replicas([topic])[(topic, 0)]},
                   f"node {third} dropped its partial copy")
    again = fabric("topic", "reassign", topic, "--partition", "0", "--cancel", "-b", cluster.bootstrap)
    assert again.returncode == 1 and "nothing to cancel" in again.stderr
    # The move again, unthrottled, in a plan that also reorders partition 1: both finish.
    p1 = parts[1]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"partitions": [
        {"topic": topic, "partition": 0, "replicas": slow},
        {"topic": topic, "partition": 1, "replicas": list(reversed(p1.replicas))}]}))
    done = fabric("topic", "reassign", "--plan", str(plan), "--wait", "--timeout", "60", "-b", cluster.bootstrap)
    assert done.returncode == 0, done.stderr
    assert "done: 2 partitions moved" in done.stdout
    with Admin(cluster.bootstrap) as admin:
        after = admin.describe_topic(topic).partitions
        copies = admin.describe_replicas([topic])
    assert tuple(after[0].replicas) == tuple(slow) and set(after[0].isr) == set(slow)
    assert tuple(after[1].replicas) == tuple(reversed(p1.replicas))
    assert {r["node_id"]: r["log_end_offset"] for r in copies[(topic, 0)]} == {n: 300 for n in slow}


def test_a_replica_removed_while_down_wipes_its_copy_when_it_returns(fresh_cluster: LocalCluster,
                                                                    topic_name: str) -> None:
    """OPERATIONS.md: a removed node deletes its copy. A running one does when the move
    reaches it; one that was down during the move never opened the partition again after
    its restart, and kept the copy for ever (found by a fault audit). Now it wipes it at
    startup."""
    cluster, topic = fresh_cluster, topic_name
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3, config={"min_insync": 2})
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(200):
            producer.send(topic, b"v%d" % i, partition=0)
        producer.flush(30)
    cluster.add_node(NEW_NODE)
    with Admin(cluster.bootstrap) as admin:
        before = admin.describe_topic(topic).partitions[0]
    removed = next(r for r in before.replicas if r != before.leader)
    cluster.stop_node(removed)
    target = [NEW_NODE if r == removed else r for r in before.replicas]
    result = fabric("topic", "reassign", topic, "--partition", "0", "--replicas", ",".join(map(str, target)),
                    "-b", cluster.bootstrap)
    assert result.returncode == 0, result.stderr

    def moved() -> bool:
        with Admin(cluster.bootstrap) as admin:
            now = admin.describe_topic(topic).partitions[0]
        return tuple(now.replicas) == tuple(target) and NEW_NODE in now.isr

    wait_until(moved, "the move finishes without the removed (stopped) replica", 60)
    cluster.start_node(removed)
    cluster.wait_for_nodes([removed])  # registered: its startup, the wipe included, is done
    history = History()
    collect_replicas(cluster, topic, 1, history)
    assert len(history.replicas[NEW_NODE].get(0, {})) > 0
    assert not history.replicas[removed].get(0), f"node {removed} still holds its copy of {topic}/0"

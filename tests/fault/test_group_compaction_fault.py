"""``__consumer_offsets`` compaction (nodes/group_records.py) under coordinator kills.

One committer commits ever larger offsets for 100 partitions as fast as it can, so the
coordinator restates its partition every ~100 commits, while the coordinator's node is
SIGKILLed (mid-restatement or not: seeded timing) and restarted, three times. The checker:
every partition's committed offset, read from the coordinator that loaded the compacted
log, is at least the last commit the cluster acknowledged and at most the last one sent
(nothing acknowledged is lost, nothing invented), and the log start moved.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from fabric import errors
from fabric.local import LocalCluster
from fabric.protocol import groups as gp
from sdk import Admin, Consumer, TopicPartition
from tests.fault.harness import wait_until

pytestmark = pytest.mark.slow

PARTITIONS = 100
KILLS = 3


def _coordinator_node(bootstrap: str, group: str) -> int:
    """The group's coordinator's node id, once the map names one (a restarted node may be
    missing from it for a moment, or named at a new address)."""
    found: list[int] = []

    def named() -> bool:
        with Admin(bootstrap, request_timeout_ms=5_000) as admin:
            address = admin._find_coordinator(group)
            found[:] = [n for n, a in admin.nodes().items() if a == address]
        return bool(found)

    wait_until(named, f"a coordinator for {group}", 60)
    return found[0]


def test_committed_offsets_survive_coordinator_kills_while_compacting(fresh_cluster: LocalCluster, seed: int) -> None:
    rng = random.Random(seed)
    bootstrap = fresh_cluster.bootstrap
    topic, group = f"compact-{seed}", f"g-compact-{seed}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    sent, acked = [0], [0]  # the last offset sent, and the last one the cluster acknowledged
    stop = threading.Event()
    failures: list[str] = []

    def commit() -> None:
        with Consumer(bootstrap, group_id=group, enable_auto_commit=False, request_timeout_ms=5_000) as consumer:
            consumer.assign(tps)
            offset = 0
            while not stop.is_set():
                offset += 1
                sent[0] = offset
                try:
                    consumer.commit({tp: offset for tp in tps})
                except errors.FabricError as exc:  # a coordinator moving: retriable, or not known
                    failures.append(type(exc).__name__)
                    time.sleep(0.05)
                    continue
                acked[0] = offset

    committer = threading.Thread(target=commit, name="committer")
    committer.start()
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.0, 3.0))
            before = acked[0]
            victim = _coordinator_node(bootstrap, group)
            fresh_cluster.nodes[victim].kill()
            wait_until(lambda before=before: acked[0] > before + 20, "commits acknowledged by a new coordinator", 60)
            fresh_cluster.nodes[victim].start()
            fresh_cluster.wait_for_nodes([victim])
        time.sleep(1.0)
    finally:
        stop.set()
        committer.join(60)
    assert not committer.is_alive()
    last_acked, last_sent = acked[0], sent[0]
    print(f"seed {seed}: {last_acked} commits acknowledged of {last_sent} sent, failures {sorted(set(failures))}")
    assert last_acked * PARTITIONS > 3 * 10_000  # enough to restate many times

    # A fresh coordinator once more (the one that loaded after the last kill may be the
    # restarted node's successor): kill it, and read what the next one loaded.
    victim = _coordinator_node(bootstrap, group)
    fresh_cluster.nodes[victim].kill()

    def committed() -> dict[int, int]:
        with Admin(bootstrap, request_timeout_ms=5_000) as admin:
            if _coordinator_node(bootstrap, group) == victim:
                raise errors.NotCoordinatorError("the killed node is still named")
            return {p.partition: p.committed for p in admin.describe_group(group).offsets}

    result: dict[int, int] = {}
    wait_until(lambda: bool(result.update(committed()) or result), "a new coordinator's offsets", 60)
    assert set(result) == set(range(PARTITIONS))
    assert all(last_acked <= offset <= last_sent for offset in result.values()), (last_acked, last_sent, result)
    with Admin(bootstrap) as admin:
        rows = admin.describe_replicas([gp.OFFSETS_TOPIC])[(gp.OFFSETS_TOPIC, gp.coordinator_partition(group))]
    leader = next(r for r in rows if r["role"] == "leader")
    assert leader["log_start_offset"] > 0, leader
    assert leader["log_end_offset"] - leader["log_start_offset"] < last_acked * PARTITIONS // 2, leader

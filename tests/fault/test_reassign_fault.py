"""Reassignment under faults: a throttled move of a partition (its leader among the
replicas removed) is interrupted by kill -9 of the controller and of the partition's
leader; a new controller resumes it from the state in ZooKeeper, the same move issued
again with no throttle finishes it, and the history checker finds nothing lost or
diverged under a steady acks=all idempotent load."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Producer
from tests.conftest import make_cluster
from tests.fault.harness import (
    describe,
    finish,
    keep_logs,
    seed_from_env,
    start_workload,
    wait_until,
)
from tests.fault.history import History

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 2_000
NODE_ARGS = ["--replica-lag-max-ms", "1500"]
PARTITIONS = 3
RATE_PER_S = 300
PRELOAD_RECORDS = 3_000
PRELOAD_VALUE_BYTES = 1_000
THROTTLE_BYTES_PER_S = 200_000  # ~15 s for the preload: long enough to be interrupted
MOVE_WAIT_S = 90.0


@pytest.fixture
def cluster(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    c = make_cluster(zk_server, tmp_path / "cluster", nodes=4, session_timeout_ms=SESSION_TIMEOUT_MS,
                     node_args=NODE_ARGS)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def controller_id(bootstrap: str) -> int:
    with Admin(bootstrap) as admin:
        return admin._meta.refresh().controller_id


def preload(bootstrap: str, topic: str, history: History) -> None:
    with Producer(bootstrap, acks="all", linger_ms=5) as producer:
        futures = []
        for i in range(PRELOAD_RECORDS):
            value = b"pre-%06d-" % i + os.urandom(PRELOAD_VALUE_BYTES)  # incompressible
            history.record_sent(value)
            futures.append((value, producer.send(topic, value, partition=0)))
        producer.flush(60)
        for value, future in futures:
            meta = future.result(30)
            history.record_ack(value, meta.partition, meta.offset)


def test_move_survives_controller_and_leader_kills(cluster: LocalCluster, request: pytest.FixtureRequest) -> None:
    seed = seed_from_env()
    bootstrap, topic = cluster.bootstrap, "moving"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3, config={"min_insync": 2})
    history, writer, reader = start_workload(bootstrap, topic, PARTITIONS, RATE_PER_S)
    preload(bootstrap, topic, history)
    try:
        before = describe(bootstrap, topic).partitions[0]
        spare = next(n for n in cluster.nodes if n not in before.replicas)
        target = [spare, *[r for r in before.replicas if r != before.leader]]
        with Admin(bootstrap) as admin:
            admin.reassign_partition(topic, 0, target, throttle_bytes_per_s=THROTTLE_BYTES_PER_S)
        time.sleep(2.0)
        assert describe(bootstrap, topic).partitions[0].replicas != tuple(target), "finished before the faults"
        # kill -9 the controller (possibly the leader too); a new one takes over the move.
        victim = controller_id(bootstrap)
        cluster.nodes[victim].kill()
        wait_until(lambda: controller_id(bootstrap) not in (-1, victim), "a new controller")
        time.sleep(1.0)
        # kill -9 the partition's current leader, if it is still up and was not the controller.
        leader = describe(bootstrap, topic).partitions[0].leader
        if leader >= 0 and leader != victim and cluster.nodes[leader].process.running:
            cluster.nodes[leader].kill()
        killed = {victim, leader}
        time.sleep(1.0)
        for node_id in sorted(killed):
            if node_id >= 0 and not cluster.nodes[node_id].process.running:
                cluster.nodes[node_id].start()
        cluster.wait_for_nodes(list(cluster.nodes))
        # The same move again, now without a throttle: accepted, and it finishes.
        with Admin(bootstrap) as admin:
            admin.reassign_partition(topic, 0, target, throttle_bytes_per_s=0, timeout_s=60)
            admin.wait_reassigned(topic, 0, target, timeout_s=MOVE_WAIT_S)
        after = describe(bootstrap, topic).partitions[0]
        assert tuple(after.replicas) == tuple(target) and after.leader in target
        time.sleep(2.0)  # writes continue on the new replica set
    except BaseException:
        keep_logs(cluster, request.node.name)
        raise
    print(f"moved {topic}/0 {list(before.replicas)} -> {target}; killed nodes {sorted(n for n in killed if n >= 0)}")
    finish(cluster, topic, PARTITIONS, history, seed, [writer], [reader])
    assert not history.replicas[before.leader].get(0), "the removed replica still holds its copy"
    assert history.replicas[spare].get(0), "the new replica holds nothing"

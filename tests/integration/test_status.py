"""``fabric status`` exit codes against real clusters: healthy, a dead node, ZooKeeper
down; and ``fabric topic describe`` showing each partition's log range."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fabric as fabric_package
from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Producer
from tests.conftest import make_cluster

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 60
SHRINK_WAIT_S = 30.0


def fabric(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("FABRIC_BOOTSTRAP", None)
    return subprocess.run([sys.executable, "-m", "fabric", *argv], env=env, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, check=False)


def status_json(cluster: LocalCluster) -> tuple[int, dict[str, Any]]:
    result = fabric("status", "--json", "-b", cluster.bootstrap)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.fixture
def cluster_with_sequencer(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path / "cluster", sequencer_count=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_healthy_then_a_dead_node(cluster_with_sequencer: LocalCluster, topic_name: str) -> None:
    fresh_cluster = cluster_with_sequencer
    with Admin(fresh_cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3, replication_factor=3)
    code, status = status_json(fresh_cluster)
    assert code == 0 and status["healthy"] and status["problems"] == []
    assert [(n["id"], n["up"]) for n in status["nodes"]] == [(1, True), (2, True), (3, True)]
    assert sum(n["leaders"] for n in status["nodes"]) == 3 and status["partitions"] == 3
    assert status["controller"] in (1, 2, 3)
    assert status["sequencer"]["sequencer_id"] == fresh_cluster.active_sequencer()
    assert {n["version"] for n in status["nodes"]} == {fabric_package.__version__}
    # The active sequencer registers its Prometheus endpoint; scraped, it says it is active.
    with urllib.request.urlopen(status["sequencer"]["metrics_address"], timeout=10) as response:
        scraped = response.read().decode()
    assert "fabric_sequencer_active 1.0" in scraped and "fabric_sequencer_info{" in scraped
    with Producer(fresh_cluster.bootstrap) as producer:
        for i in range(10):
            producer.send(topic_name, b"%d" % i, partition=0)
        producer.flush(30)
    with Admin(fresh_cluster.bootstrap) as admin:
        admin.reset_offsets("status-group", topic_name, to="earliest")
    code, status = status_json(fresh_cluster)
    assert code == 0 and [(g["group_id"], g["lag"]) for g in status["groups"]] == [("status-group", 10)]
    screen = fabric("status", "-b", fresh_cluster.bootstrap)
    assert screen.returncode == 0 and "HEALTHY" in screen.stdout and "status-group" in screen.stdout

    fresh_cluster.nodes[3].kill()
    deadline = time.monotonic() + SHRINK_WAIT_S
    while True:
        code, status = status_json(fresh_cluster)
        # SIGKILL: the znode goes at the session timeout, the ISR shrinks at replica_lag_max_ms,
        # and the controller then moves node 3's leaderships (until it has, those partitions
        # are rightly reported offline).
        node3_down = any(n["id"] == 3 and not n["up"] for n in status["nodes"])
        for row in status["offline_partitions"]:  # seen between the death and the re-election
            assert set(row["live_isr"]) <= set(row["isr"]) and 3 not in row["live_isr"]
            assert any("in-sync replica to elect" in p for p in status["problems"])
        settled = status["under_replicated_partitions"] and node3_down and not status["offline_partitions"]
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == 1 and not status["healthy"]
    assert [(n["id"], n["up"]) for n in status["nodes"]] == [(1, True), (2, True), (3, False)]
    assert any("node 3 is down" in p for p in status["problems"])
    assert status["under_replicated_partitions"], "the ISR never shrank after node 3 died"
    assert all(row["missing"] == [3] for row in status["under_replicated_partitions"])
    assert status["offline_partitions"] == [] and status["controller"] in (1, 2)
    screen = fabric("status", "-b", fresh_cluster.bootstrap)
    assert screen.returncode == 1 and "UNHEALTHY" in screen.stdout and "DOWN" in screen.stdout


def test_zookeeper_down_exits_3(tmp_path: Path) -> None:
    zookeeper = LocalZooKeeper(tmp_path)
    zookeeper.start()
    zookeeper.stop()  # the address a cluster used, with nothing answering any more
    result = fabric("status", "-b", f"zk://{zookeeper.address}", "--timeout", "2")
    assert result.returncode == 3
    assert f"ZooKeeper at {zookeeper.address} did not answer within 2 s" in result.stderr
    assert "Traceback" not in result.stderr
    as_json = fabric("status", "--json", "-b", f"zk://{zookeeper.address}", "--timeout", "2")
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["healthy"] is False


def test_topic_describe_shows_log_range(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, replication_factor=3)
    with Producer(cluster.bootstrap) as producer:
        for i in range(10):
            producer.send(topic_name, b"%d" % i, partition=0)
        producer.flush(30)
    result = fabric("topic", "describe", topic_name, "-b", cluster.bootstrap)
    assert result.returncode == 0, result.stderr
    lines = {line.split(":")[0].strip(): line for line in result.stdout.splitlines() if "partition " in line}
    # The leader's range and its size on disk (DESCRIBE_REPLICAS): ten small records in
    # one or a few batches, some bytes; nothing in partition 1.
    assert "log 0..10 (10 records, " in lines["partition 0"] and "log 0..10 (10 records, 0 B)" not in lines["partition 0"]
    assert "log 0..0 (0 records, 0 B)" in lines["partition 1"]


def test_offline_partitions_say_whether_a_live_in_sync_replica_can_be_elected(zk_server: LocalZooKeeper) -> None:
    """Partition states written straight into a real ZooKeeper (no nodes running): one
    offline partition has a live in-sync replica for the controller to elect, the other
    only a dead one."""
    from kazoo.client import KazooClient

    from fabric import zk as zkl
    from fabric.cli.status import collect, render

    chroot = f"/status-offline-{os.getpid()}"
    root = KazooClient(hosts=zk_server.address, timeout=10)
    root.start(timeout=10)
    try:
        root.ensure_path(chroot)
    finally:
        root.stop()
        root.close()
    zk = KazooClient(hosts=zk_server.address + chroot, timeout=10)
    zk.start(timeout=10)
    try:
        zk.create(zkl.node_path(1), zkl.NodeInfo(1, "tcp://127.0.0.1:1").encode(), makepath=True)
        zk.create(zkl.topic_path("t"), zkl.TopicConfig(partitions=2).encode(), makepath=True)
        for state in (zkl.PartitionState(0, (1, 2, 3), leader=2, leader_epoch=4, isr=(1, 2)),
                      zkl.PartitionState(1, (2, 3), leader=3, leader_epoch=2, isr=(3,))):
            zk.create(zkl.partition_path("t", state.partition), state.encode(), makepath=True)
        status = collect(zk, zk_server.address + chroot)
    finally:
        zk.stop()
        zk.close()
    assert [(row["partition"], row["live_isr"]) for row in status.offline] == [(0, [1]), (1, [])]
    assert any("2 partitions offline" in p and "1 with a live in-sync replica to elect, 1 waiting" in p
               for p in status.problems)
    screen = render(status)
    assert "t/0  leader 2" in screen and "live in-sync [1]" in screen and "no live in-sync replica" in screen

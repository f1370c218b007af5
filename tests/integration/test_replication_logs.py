"""Replication log lines of real nodes, with ``--log-format json``: one JSON object per
line, and the lines about a replica (leader and follower changes, mode changes) carry
the node id, topic, partition and epoch as fields."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Producer
from tests.conftest import make_cluster

LOG_WAIT_S = 10.0


@pytest.fixture
def json_cluster(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    c = make_cluster(zk_server, tmp_path / "cluster", node_args=["--log-format", "json"])
    c.start()
    try:
        yield c
    finally:
        c.stop()


def json_lines(cluster: LocalCluster, node_id: int) -> list[dict[str, object]]:
    text = cluster.nodes[node_id].process.log_path.read_text(errors="replace")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_replication_lines_carry_node_partition_and_epoch(json_cluster: LocalCluster, topic_name: str) -> None:
    cluster = json_cluster
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
        first = admin.describe_topic(topic_name).partitions[0]
        leader, epoch = first.leader, first.leader_epoch  # a new topic's first epoch comes from its creation time
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send(topic_name, b"x", partition=0).result(30)
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        lines = {n: [r for r in json_lines(cluster, n) if r.get("topic") == topic_name] for n in cluster.nodes}
        followers = [n for n in cluster.nodes if n != leader]
        if (any("leader of" in str(r["msg"]) for r in lines[leader])
                and all(any("-> streaming" in str(r["msg"]) for r in lines[n]) for n in followers)) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    became = [r for r in lines[leader] if "leader of" in str(r["msg"])]
    assert became, lines[leader]
    assert became[0]["node"] == leader and became[0]["partition"] == 0 and became[0]["epoch"] == epoch
    assert became[0]["process"] == f"node{leader}" and became[0]["level"] == "INFO"
    for n in followers:
        streaming = [r for r in lines[n] if "-> streaming" in str(r["msg"])]
        assert streaming, lines[n]
        assert streaming[0]["node"] == n and streaming[0]["partition"] == 0 and streaming[0]["epoch"] == epoch
    # Every line a node wrote is JSON (kazoo's included), none plain text.
    text = cluster.nodes[leader].process.log_path.read_text(errors="replace")
    assert all(line.startswith("{") for line in text.splitlines() if line.strip()), text[:500]

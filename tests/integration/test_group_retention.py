"""Offsets retention on real nodes (docs/GROUPS.md, nodes/group_retention.py): a consumer
group that has been empty for ``offsets_retention_ms`` disappears with its offsets, from
the coordinator and from ``__consumer_offsets``, while a group with a live member keeps
its offsets however old. Without it every abandoned group id stayed for ever."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric import errors
from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Consumer, Producer, TopicPartition
from tests.conftest import make_cluster

RETENTION_MS = 3_000


@pytest.fixture
def short_retention_cluster(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    c = make_cluster(zk_server, tmp_path / "cluster", node_args=["--offsets-retention-ms", str(RETENTION_MS)])
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _join_and_commit(consumer: Consumer, topic: str) -> None:
    consumer.subscribe([topic])
    deadline = time.monotonic() + 20
    while not consumer.poll(timeout_ms=200):
        assert time.monotonic() < deadline, "the group never handed out the record"
    consumer.commit()


def test_an_abandoned_group_expires_and_a_live_one_keeps_its_offsets(
        short_retention_cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = short_retention_cluster.bootstrap
    tp = TopicPartition(topic_name, 0)
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
        with Producer(bootstrap) as producer:
            producer.send(topic_name, b"x", partition=0).result(timeout=10)
        options = {"auto_offset_reset": "earliest", "session_timeout_ms": 6_000, "heartbeat_interval_ms": 1_000}
        with Consumer(bootstrap, group_id="abandoned", **options) as gone:  # type: ignore[arg-type]
            _join_and_commit(gone, topic_name)
        with Consumer(bootstrap, group_id="live", enable_auto_commit=False, **options) as live:  # type: ignore[arg-type]
            _join_and_commit(live, topic_name)
            deadline = time.monotonic() + 30
            while "abandoned" in {g.group_id for g in admin.list_groups()}:
                assert time.monotonic() < deadline, "the empty group was never expired"
                live.poll(timeout_ms=300)  # heartbeats: this group is not empty
            with pytest.raises(errors.GroupIdNotFoundError):
                admin.describe_group("abandoned")
            live.poll(timeout_ms=RETENTION_MS)  # past the retention, still a member
            assert live.committed(tp) == 1
            assert "live" in {g.group_id for g in admin.list_groups()}
        with Consumer(bootstrap, group_id="abandoned", **options) as back:  # type: ignore[arg-type]
            assert back.committed(tp) is None  # starts again at auto_offset_reset, as in Kafka

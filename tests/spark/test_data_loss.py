"""failOnDataLoss: offsets a query still needs, deleted by retention."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Consumer, TopicPartition
from tests.conftest import make_cluster
from tests.spark.conftest import create_topic, produce

pytestmark = pytest.mark.spark

RETENTION_WAIT_S = 30.0


@pytest.fixture(scope="module")
def retention_cluster(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = make_cluster(zk_server, tmp_path_factory.mktemp("retention"), nodes=1,
                     node_args=["--retention-check-interval-ms", "100"])
    c.start()
    try:
        yield c
    finally:
        c.stop()


def fill_until_deleted(bootstrap: str, topic: str, rounds: int) -> int:
    """Produce ``rounds`` separate batches of incompressible records; return the log start
    offset once retention (a few hundred bytes) has deleted the oldest ones."""
    for _ in range(rounds):
        produce(bootstrap, topic, [os.urandom(200) for _ in range(5)], partition=0)
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + RETENTION_WAIT_S
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        while True:  # retention runs on the node's schedule; poll its visible effect
            start = consumer.beginning_offsets([tp])[tp]
            if start > 0:
                return start
            if time.monotonic() > deadline:
                raise AssertionError(f"retention did not delete anything of {topic} in {RETENTION_WAIT_S} s")
            time.sleep(0.1)


def batch_read(spark: Any, bootstrap: str, topic: str, fail: bool) -> list[Any]:
    return (spark.read.format("fabric").option("bootstrap", bootstrap).option("subscribe", topic)
            .option("startingOffsets", json.dumps({topic: {"0": 0}})).option("failOnDataLoss", str(fail).lower())
            .load().collect())


def test_batch_read_of_deleted_offsets(spark: Any, retention_cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = retention_cluster.bootstrap
    create_topic(bootstrap, topic_name, 1, retention_bytes=1500)
    first = fill_until_deleted(bootstrap, topic_name, 4)
    with pytest.raises(Exception, match=r"were deleted.*failOnDataLoss"):
        batch_read(spark, bootstrap, topic_name, fail=True)
    got = batch_read(spark, bootstrap, topic_name, fail=False)
    assert got and min(r.offset for r in got) >= first


def test_stream_restart_after_retention(spark: Any, retention_cluster: LocalCluster, topic_name: str,
                                        tmp_path: Path) -> None:
    """A stopped query comes back to find its next offsets deleted."""
    bootstrap = retention_cluster.bootstrap
    create_topic(bootstrap, topic_name, 1, retention_bytes=1500)
    produce(bootstrap, topic_name, [b"x"], partition=0)

    def start(checkpoint: Path, fail: bool) -> Any:
        df = (spark.readStream.format("fabric").option("bootstrap", bootstrap).option("subscribe", topic_name)
              .option("startingOffsets", "earliest").option("failOnDataLoss", str(fail).lower()).load())
        return (df.select("offset").writeStream.format("parquet").option("path", str(checkpoint / "out"))
                .option("checkpointLocation", str(checkpoint / "cp")).start())

    for checkpoint, fail in ((tmp_path / "strict", True), (tmp_path / "lenient", False)):
        query = start(checkpoint, fail)
        query.processAllAvailable()
        query.stop()
    first = fill_until_deleted(bootstrap, topic_name, 4)

    query = start(tmp_path / "strict", True)
    with pytest.raises(Exception, match="failOnDataLoss"):
        query.processAllAvailable()
    query.stop()

    query = start(tmp_path / "lenient", False)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    offsets = sorted(r.offset for r in spark.read.parquet(str(tmp_path / "lenient" / "out")).collect())
    # Offset 0 was read before the deletion; then everything that retention left, once each.
    assert offsets[0] == 0 and offsets[1] >= first and offsets[1:] == list(range(offsets[1], 21))

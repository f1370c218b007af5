"""Batch and streaming writes through ``format("fabric")``, and exactly-once of the sink."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from fabric.local import LocalCluster
from spark_connector._writer import FabricStreamWriter, idempotence_available, producer_id_for
from tests.spark.conftest import create_topic, produce, read_all

pytestmark = pytest.mark.spark

needs_idempotence = pytest.mark.skipif(
    not idempotence_available(), reason="the SDK has no idempotent producer yet (Producer(enable_idempotence=...))")


def test_batch_write_value_key_headers_partition(spark: Any, cluster: LocalCluster, topic_name: str) -> None:
    create_topic(cluster.bootstrap, topic_name, 2)
    df = spark.createDataFrame(
        [(f"v{i}", f"k{i}".encode(), i % 2, [("h", f"{i}".encode())]) for i in range(20)],
        "value string, key binary, partition int, headers array<struct<key: string, value: binary>>",
    )
    df.write.format("fabric").mode("append").option("bootstrap", cluster.bootstrap).option("topic", topic_name).save()
    got = read_all(cluster.bootstrap, topic_name, 2)
    assert len(got) == 20
    assert sorted(v for _, _, _, v in got) == sorted(f"v{i}".encode() for i in range(20))
    assert all(p == int(v[1:]) % 2 and k == b"k" + v[1:] for p, _, k, v in got)
    back = spark.read.format("fabric").option("bootstrap", cluster.bootstrap).option("subscribe", topic_name) \
        .option("includeHeaders", "true").load().where("value = cast('v3' as binary)").collect()
    assert [(h.key, bytes(h.value)) for h in back[0].headers] == [("h", b"3")]


def test_batch_write_topic_column(spark: Any, cluster: LocalCluster, topic_name: str) -> None:
    a, b = f"{topic_name}-a", f"{topic_name}-b"
    create_topic(cluster.bootstrap, a, 1)
    create_topic(cluster.bootstrap, b, 1)
    df = spark.createDataFrame([(a if i < 3 else b, bytes([i])) for i in range(10)], "topic string, value binary")
    df.write.format("fabric").mode("append").option("bootstrap", cluster.bootstrap).save()
    assert len(read_all(cluster.bootstrap, a, 1)) == 3
    assert len(read_all(cluster.bootstrap, b, 1)) == 7


def test_write_needs_a_value_column_and_a_topic(spark: Any, cluster: LocalCluster) -> None:
    writer = spark.createDataFrame([(1,)], "x int").write.format("fabric").mode("append").option("bootstrap", cluster.bootstrap)
    with pytest.raises(Exception, match="needs a 'value' column"):
        writer.option("topic", "t").save()
    writer = spark.createDataFrame([("v",)], "value string").write.format("fabric").mode("append").option("bootstrap", cluster.bootstrap)
    with pytest.raises(Exception, match="option topic, or a 'topic' column"):
        writer.save()


def _copy_query(spark: Any, cluster: LocalCluster, source: str, sink: str, checkpoint: Path,
                exactly_once: bool = True) -> Any:
    df = (spark.readStream.format("fabric").option("bootstrap", cluster.bootstrap).option("subscribe", source)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "40").load())
    return (df.selectExpr("key", "upper(cast(value as string)) as value").writeStream.format("fabric")
            .option("bootstrap", cluster.bootstrap).option("topic", sink)
            .option("exactlyOnce", str(exactly_once).lower())
            .option("checkpointLocation", str(checkpoint)).start())


def test_stream_write(spark: Any, cluster: LocalCluster, topic_name: str, tmp_path: Path) -> None:
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(cluster.bootstrap, source, 2)
    create_topic(cluster.bootstrap, sink, 2)
    produce(cluster.bootstrap, source, [f"m{i}".encode() for i in range(50)], keys=[f"u{i % 7}".encode() for i in range(50)])
    query = _copy_query(spark, cluster, source, sink, tmp_path / "cp")
    try:
        query.processAllAvailable()
        produce(cluster.bootstrap, source, [f"n{i}".encode() for i in range(30)])
        query.processAllAvailable()
    finally:
        query.stop()
    got = read_all(cluster.bootstrap, sink, 2)
    assert sorted(v for _, _, _, v in got) == sorted([f"M{i}".encode() for i in range(50)] + [f"N{i}".encode() for i in range(30)])


@needs_idempotence
def test_same_task_written_twice_is_kept_once(cluster: LocalCluster, topic_name: str) -> None:
    """A task retry: the same micro-batch, Spark partition and rows, sent twice."""
    create_topic(cluster.bootstrap, topic_name, 3)
    from pyspark.sql.types import BinaryType, StructField, StructType

    writer = FabricStreamWriter({"bootstrap": cluster.bootstrap, "topic": topic_name, "batchBytesMax": "2048"},
                                StructType([StructField("key", BinaryType()), StructField("value", BinaryType())]))

    def rows() -> list[pa.RecordBatch]:
        keys = [f"user-{i % 11}".encode() for i in range(500)]
        values = [f"event-{i}".encode() * 5 for i in range(500)]
        return [pa.RecordBatch.from_arrays([pa.array(keys[i:i + 100]), pa.array(values[i:i + 100])], ["key", "value"])
                for i in range(0, 500, 100)]

    first = writer.write_task(iter(rows()), batch_id=7, partition_id=1, sink_id="test-sink")
    second = writer.write_task(iter(rows()), batch_id=7, partition_id=1, sink_id="test-sink")
    assert first.producer_id == second.producer_id == producer_id_for("test-sink", 7, 1)
    got = read_all(cluster.bootstrap, topic_name, 3)
    assert len(got) == 500
    # The next micro-batch is a different producer: its rows are new records.
    writer.write_task(iter(rows()), batch_id=8, partition_id=1, sink_id="test-sink")
    assert len(read_all(cluster.bootstrap, topic_name, 3)) == 1000


@needs_idempotence
@pytest.mark.parametrize("exactly_once", [True, False])
def test_exactly_once_across_a_killed_query(spark: Any, cluster: LocalCluster, topic_name: str, tmp_path: Path,
                                            exactly_once: bool) -> None:
    """The query dies after its sink wrote a micro-batch but before Spark logged the commit
    (we delete the last commit file, which is what such a kill leaves behind); the restarted
    query re-runs that micro-batch with the same id, and nothing is written twice. With
    exactlyOnce=false the same scenario duplicates the re-run batch: the test can fail."""
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(cluster.bootstrap, source, 2)
    create_topic(cluster.bootstrap, sink, 3)
    sent = [f"m{i}".encode() for i in range(100)]
    produce(cluster.bootstrap, source, sent[:70], keys=[f"u{i % 5}".encode() for i in range(70)])
    checkpoint = tmp_path / "cp"
    query = _copy_query(spark, cluster, source, sink, checkpoint, exactly_once)
    query.processAllAvailable()
    query.stop()
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(commits) >= 2  # 70 records at 40 per trigger
    commits[-1].unlink()  # "killed" between the sink's write and the commit log
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    assert len(read_all(cluster.bootstrap, sink, 3)) == 70

    produce(cluster.bootstrap, source, sent[70:])
    query = _copy_query(spark, cluster, source, sink, checkpoint, exactly_once)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    got = sorted(v for _, _, _, v in read_all(cluster.bootstrap, sink, 3))
    if exactly_once:
        assert got == sorted(v.upper() for v in sent)
    else:
        assert len(got) > len(sent) and set(got) == {v.upper() for v in sent}  # the re-run batch twice

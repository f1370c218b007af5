"""Batch and streaming writes through ``format("fabric")``, and exactly-once of the sink."""

from __future__ import annotations

import shutil
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


def test_unknown_topic_option_fails_on_the_driver(spark: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    """Before any task starts, with a plain message: tasks used to wait for the topic to
    appear, fail, and be retried by Spark."""
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match=r"unknown topic 'no-such-topic' \(option topic\)"):
        df.write.format("fabric").mode("append").option("bootstrap", cluster.bootstrap).option("topic", "no-such-topic").save()
    stream = spark.readStream.format("rate").option("rowsPerSecond", "1").load().selectExpr("cast(value as string) as value")
    with pytest.raises(Exception, match=r"unknown topic 'no-such-topic' \(option topic\)"):
        query = (stream.writeStream.format("fabric").option("bootstrap", cluster.bootstrap)
                 .option("topic", "no-such-topic").option("checkpointLocation", str(tmp_path / "cp")).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()


def test_overwrite_mode_is_refused(spark: Any, cluster: LocalCluster, topic_name: str) -> None:
    """mode("overwrite") used to append silently; a topic cannot be overwritten (Kafka refuses it too)."""
    create_topic(cluster.bootstrap, topic_name, 1)
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="save mode overwrite is not supported"):
        df.write.format("fabric").mode("overwrite").option("bootstrap", cluster.bootstrap).option("topic", topic_name).save()
    assert read_all(cluster.bootstrap, topic_name, 1) == []


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
@pytest.mark.parametrize("columns", ["value", "topic_value"])
def test_keyless_task_written_twice_is_kept_once(cluster: LocalCluster, topic_name: str, columns: str) -> None:
    """Rows without a key (and without a partition) must go to the same partitions on every
    attempt of a task. The producer's sticky partitioner starts at a random partition per
    producer, so a re-run used to send them elsewhere: the node refused the re-run
    (OUT_OF_ORDER_SEQUENCE) or wrote it twice. ``value`` alone takes the bulk path
    (send_batch); with a ``topic`` column each row goes through send()."""
    create_topic(cluster.bootstrap, topic_name, 3)
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    fields = [StructField("value", BinaryType())]
    options = {"bootstrap": cluster.bootstrap, "batchBytesMax": "2048", "topic": topic_name}
    if columns == "topic_value":
        fields.insert(0, StructField("topic", StringType()))
        del options["topic"]
    writer = FabricStreamWriter(options, StructType(fields))

    def rows(task: int) -> list[pa.RecordBatch]:
        out = []
        for i in range(0, 300, 100):
            values = pa.array([f"task-{task}-event-{j}".encode() * 5 for j in range(i, i + 100)])
            arrays = [pa.array([topic_name] * 100), values] if columns == "topic_value" else [values]
            out.append(pa.RecordBatch.from_arrays(arrays, [f.name for f in fields]))
        return out

    for task in range(4):  # four tasks: a random start would match the first attempt's by chance 1 in 81
        for _ in range(2):
            writer.write_task(iter(rows(task)), batch_id=3, partition_id=task, sink_id="keyless-sink")
    got = read_all(cluster.bootstrap, topic_name, 3)
    assert sorted(v for _, _, _, v in got) == sorted(
        f"task-{t}-event-{j}".encode() * 5 for t in range(4) for j in range(300))
    assert len({p for p, _, _, _ in got}) > 1  # still spread over the partitions


def test_query_restarted_from_scratch_writes_everything(spark: Any, cluster: LocalCluster, topic_name: str,
                                                        tmp_path: Path) -> None:
    """A checkpoint deleted and a new query started at the same location: its micro-batches
    count from 0 again. The sink's producer ids used to come from the checkpoint location,
    so the new query's batches took the old query's ids, and the node acknowledged its
    records as duplicates without writing them (silent loss). They come from the query id,
    which is new for a new checkpoint."""
    first, second, sink = f"{topic_name}-a", f"{topic_name}-b", f"{topic_name}-out"
    for name in (first, second, sink):
        create_topic(cluster.bootstrap, name, 1)
    produce(cluster.bootstrap, first, [f"first-{i}".encode() for i in range(10)])
    produce(cluster.bootstrap, second, [f"second-{i}".encode() for i in range(10)])
    checkpoint = tmp_path / "cp"
    for source in (first, second):
        shutil.rmtree(checkpoint, ignore_errors=True)  # the user resets the query
        query = (spark.readStream.format("fabric").option("bootstrap", cluster.bootstrap).option("subscribe", source)
                 .option("startingOffsets", "earliest").load().select("value").writeStream.format("fabric")
                 .option("bootstrap", cluster.bootstrap).option("topic", sink)
                 .option("checkpointLocation", str(checkpoint)).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    got = sorted(v for _, _, _, v in read_all(cluster.bootstrap, sink, 1))
    assert got == sorted([f"first-{i}".encode() for i in range(10)] + [f"second-{i}".encode() for i in range(10)])


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

"""Batch and streaming reads through ``format("fabric")`` against a real 3-node cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition
from tests.spark.conftest import create_topic, produce

pytestmark = pytest.mark.spark


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def reader(spark: Any, cluster: LocalCluster, **options: str) -> Any:
    r = spark.read.format("fabric").option("bootstrap", cluster.bootstrap)
    for name, value in options.items():
        r = r.option(name, value)
    return r.load()


def rows(df: Any) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in df.select("partition", "offset", "value").collect())


@pytest.fixture(scope="module")
def three(cluster: LocalCluster) -> str:
    """A topic with 3 partitions holding 10, 20 and 30 records."""
    name = "spark-read-three"
    create_topic(cluster.bootstrap, name, 3)
    for p, n in enumerate((10, 20, 30)):
        produce(cluster.bootstrap, name, values(f"p{p}", n), partition=p)
    return name


def test_batch_read_schema_and_all_records(spark: Any, cluster: LocalCluster, three: str) -> None:
    df = reader(spark, cluster, subscribe=three)
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    got = rows(df)
    assert len(got) == 60
    assert got[:2] == [(0, 0, b"p0-0"), (0, 1, b"p0-1")]
    assert [r for r in got if r[0] == 2][-1] == (2, 29, b"p2-29")
    first = df.where("partition = 1 and offset = 3").collect()[0]
    assert first.topic == three and first.timestampType == 0 and first.timestamp is not None


def test_batch_read_offset_forms(spark: Any, cluster: LocalCluster, three: str) -> None:
    start = json.dumps({three: {"0": 5, "1": -2, "2": 25}})
    end = json.dumps({three: {"0": -1, "1": 3, "2": 27}})
    got = rows(reader(spark, cluster, subscribe=three, startingOffsets=start, endingOffsets=end))
    assert [(p, o) for p, o, _ in got] == [(0, o) for o in range(5, 10)] + [(1, 0), (1, 1), (1, 2), (2, 25), (2, 26)]
    assert len(rows(reader(spark, cluster, subscribe=three, startingOffsets="earliest", endingOffsets="latest"))) == 60
    assigned = rows(reader(spark, cluster, assign=json.dumps({three: [2]})))
    assert {p for p, _, _ in assigned} == {2} and len(assigned) == 30
    by_pattern = rows(reader(spark, cluster, subscribePattern="spark-read-th.*"))
    assert len(by_pattern) == 60


def test_large_range_is_split_into_several_tasks(spark: Any, cluster: LocalCluster, three: str) -> None:
    df = reader(spark, cluster, subscribe=three, maxRecordsPerPartition="7")
    # 10, 20, 30 records in ranges of at most 7: 2 + 3 + 5 input partitions.
    assert df.rdd.getNumPartitions() == 10
    assert len(rows(df)) == 60


def test_headers_are_read(spark: Any, cluster: LocalCluster, topic_name: str) -> None:
    create_topic(cluster.bootstrap, topic_name, 1)
    produce(cluster.bootstrap, topic_name, [b"a", b"b"], keys=[b"k1", b"k2"],
            headers=[[("h", b"1"), ("n", None)], None])
    df = reader(spark, cluster, subscribe=topic_name, includeHeaders="true")
    got = sorted(df.collect(), key=lambda r: r.offset)
    assert bytes(got[0].key) == b"k1"
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in got[0].headers] == [("h", b"1"), ("n", None)]
    assert got[1].headers == []


def test_rows_match_the_sdk_consumer(spark: Any, cluster: LocalCluster, topic_name: str) -> None:
    """Every column, null keys and values, headers, and a range that starts and ends inside
    batches (the task slices the fetched batches' columns)."""
    create_topic(cluster.bootstrap, topic_name, 1)
    with Producer(cluster.bootstrap, acks="all", linger_ms=20, batch_bytes_max=2000) as producer:
        for i in range(300):
            producer.send(topic_name, None if i % 7 == 3 else f"v{i}".encode() * (i % 5),
                          key=None if i % 3 else f"k{i}".encode(), partition=0,
                          headers=[("i", str(i).encode()), ("none", None)] if i % 4 == 0 else None)
        producer.flush(60)
    tp = TopicPartition(topic_name, 0)
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        batches = []
        while sum(map(len, batches)) < 300:
            batches.extend(consumer.poll_batches(timeout_ms=5000))
    assert len(batches) > 3, "the range should span several batches"
    sdk_rows = [(r.offset, r.key, r.value, r.timestamp, [(k, v) for k, v in r.headers], b.timestamp_type)
                for b in batches for r in b.records() if 7 <= r.offset < 251]
    df = reader(spark, cluster, subscribe=topic_name, includeHeaders="true",
                startingOffsets=json.dumps({topic_name: {"0": 7}}), endingOffsets=json.dumps({topic_name: {"0": 251}}))
    got = [(r.offset, None if r.key is None else bytes(r.key), None if r.value is None else bytes(r.value),
            round(r.timestamp.timestamp() * 1000), [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers],
            r.timestampType)
           for r in sorted(df.collect(), key=lambda r: r.offset)]
    assert got == sdk_rows
    assert {r.topic for r in df.select("topic").collect()} == {topic_name}


def test_unknown_topic_is_a_clear_error(spark: Any, cluster: LocalCluster) -> None:
    with pytest.raises(Exception, match="unknown topic 'no-such-topic'"):
        reader(spark, cluster, subscribe="no-such-topic").collect()


@pytest.mark.parametrize("option, text, message", [
    ("startingOffsets", '{"t": {"0": 1', "not valid JSON"),
    ("startingOffsets", '{"t": {"zero": 1}}', "not a number"),
    ("endingOffsets", '["t"]', "must be a JSON object"),
    ("assign", "{t: [0]}", "option assign is not valid JSON"),
])
def test_malformed_options_are_clear_errors(spark: Any, cluster: LocalCluster, option: str, text: str,
                                            message: str) -> None:
    selection = {} if option == "assign" else {"subscribe": "t"}
    with pytest.raises(Exception, match=message):
        reader(spark, cluster, **selection, **{option: text}).collect()


def test_offsets_must_name_every_partition(spark: Any, cluster: LocalCluster, three: str) -> None:
    with pytest.raises(Exception, match=r"missing: .*/1"):
        reader(spark, cluster, subscribe=three, startingOffsets=json.dumps({three: {"0": 0, "2": 0}})).collect()


# -- streaming ------------------------------------------------------------------------------------
def stream(spark: Any, cluster: LocalCluster, topic: str, **options: str) -> Any:
    r = spark.readStream.format("fabric").option("bootstrap", cluster.bootstrap).option("subscribe", topic)
    for name, value in options.items():
        r = r.option(name, value)
    return r.load()


def start_memory_query(df: Any, name: str, checkpoint: Path) -> Any:
    return (df.selectExpr("partition", "offset", "value").writeStream.format("memory").queryName(name)
            .option("checkpointLocation", str(checkpoint)).outputMode("append").start())


def memory_rows(spark: Any, name: str) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, bytes(r.value)) for r in spark.table(name).collect())


def test_stream_reads_appends_as_they_come(spark: Any, cluster: LocalCluster, topic_name: str, tmp_path: Path) -> None:
    create_topic(cluster.bootstrap, topic_name, 2)
    produce(cluster.bootstrap, topic_name, values("old", 5), partition=0)
    query = start_memory_query(stream(spark, cluster, topic_name, startingOffsets="earliest"), "appends", tmp_path)
    try:
        query.processAllAvailable()
        assert len(memory_rows(spark, "appends")) == 5
        produce(cluster.bootstrap, topic_name, values("new", 7), partition=1)
        produce(cluster.bootstrap, topic_name, values("more", 3), partition=0)
        query.processAllAvailable()
        got = memory_rows(spark, "appends")
        assert [(p, o) for p, o, _ in got] == [(0, o) for o in range(8)] + [(1, o) for o in range(7)]
        end = query.lastProgress["sources"][0]["endOffset"]
        assert end == json.dumps({topic_name: {"0": 8, "1": 7}})  # our text, keys sorted, kept verbatim
    finally:
        query.stop()


def test_stream_starts_at_latest_by_default(spark: Any, cluster: LocalCluster, topic_name: str, tmp_path: Path) -> None:
    create_topic(cluster.bootstrap, topic_name, 1)
    produce(cluster.bootstrap, topic_name, values("before", 4), partition=0)
    query = start_memory_query(stream(spark, cluster, topic_name), "latest_default", tmp_path)
    try:
        query.processAllAvailable()
        produce(cluster.bootstrap, topic_name, values("after", 2), partition=0)
        query.processAllAvailable()
        assert [v for _, _, v in memory_rows(spark, "latest_default")] == [b"after-0", b"after-1"]
    finally:
        query.stop()


def test_max_offsets_per_trigger(spark: Any, cluster: LocalCluster, topic_name: str, tmp_path: Path) -> None:
    create_topic(cluster.bootstrap, topic_name, 2)
    produce(cluster.bootstrap, topic_name, values("a", 30), partition=0)
    produce(cluster.bootstrap, topic_name, values("b", 10), partition=1)
    df = stream(spark, cluster, topic_name, startingOffsets="earliest", maxOffsetsPerTrigger="12")
    query = start_memory_query(df, "limited", tmp_path)
    try:
        query.processAllAvailable()
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert sum(sizes) == 40
        assert max(sizes) <= 12 and len(sizes) == 4  # 12 + 12 + 12 + 4
        assert len(memory_rows(spark, "limited")) == 40
    finally:
        query.stop()


def test_restart_from_checkpoint_no_loss_no_duplicates(spark: Any, cluster: LocalCluster, topic_name: str,
                                                       tmp_path: Path) -> None:
    create_topic(cluster.bootstrap, topic_name, 3)
    produce(cluster.bootstrap, topic_name, values("one", 30))
    out = tmp_path / "out"

    def start() -> Any:
        df = stream(spark, cluster, topic_name, startingOffsets="earliest", maxOffsetsPerTrigger="10")
        return (df.selectExpr("partition", "offset", "value").writeStream.format("parquet")
                .option("path", str(out)).option("checkpointLocation", str(tmp_path / "cp")).start())

    query = start()
    query.processAllAvailable()
    query.stop()
    produce(cluster.bootstrap, topic_name, values("two", 25))  # arrives while the query is down
    query = start()
    try:
        query.processAllAvailable()
        produce(cluster.bootstrap, topic_name, values("three", 5))
        query.processAllAvailable()
    finally:
        query.stop()
    got = [(r.partition, r.offset) for r in spark.read.parquet(str(out)).collect()]
    assert len(got) == 60 and len(set(got)) == 60
    assert sorted(bytes(r.value).decode().split("-")[0] for r in spark.read.parquet(str(out)).collect()).count("two") == 25


def test_stream_reads_added_partitions_from_earliest(spark: Any, cluster: LocalCluster, topic_name: str,
                                                     tmp_path: Path) -> None:
    """Partitions added to a topic while a stream runs (``Admin.create_partitions``) are read
    from their first offset, including what was written before the stream noticed them."""
    create_topic(cluster.bootstrap, topic_name, 1)
    produce(cluster.bootstrap, topic_name, values("p0", 4), partition=0)
    query = start_memory_query(stream(spark, cluster, topic_name), "grown", tmp_path)  # default: latest
    try:
        query.processAllAvailable()
        assert memory_rows(spark, "grown") == []
        with Admin(cluster.bootstrap) as admin:
            admin.create_partitions(topic_name, 3)
        produce(cluster.bootstrap, topic_name, values("p1", 5), partition=1)
        produce(cluster.bootstrap, topic_name, values("p2", 2), partition=2)
        produce(cluster.bootstrap, topic_name, values("p0-new", 1), partition=0)
        query.processAllAvailable()
        got = memory_rows(spark, "grown")
        assert [(p, o) for p, o, _ in got] == [(0, 4)] + [(1, o) for o in range(5)] + [(2, 0), (2, 1)]
        assert [v for _, _, v in got][:2] == [b"p0-new-0", b"p1-0"]
        end = query.lastProgress["sources"][0]["endOffset"]
        assert json.loads(end) == {topic_name: {"0": 5, "1": 5, "2": 2}}
    finally:
        query.stop()


def test_range_ending_inside_a_batch_is_not_data_loss(spark: Any, cluster: LocalCluster, topic_name: str) -> None:
    """A range that ends inside a fetched batch, with more batches after it in the same
    fetch answer: the task stops at its end. It used to go on to the next batch of the
    answer and fail with a false DataLossError ("offsets N..M are missing"), which broke
    every split range (maxRecordsPerPartition, minPartitions, a default read of a partition
    over 500,000 records) and endingOffsets inside a batch."""
    create_topic(cluster.bootstrap, topic_name, 1)
    with Producer(cluster.bootstrap, acks="all", linger_ms=60_000, batch_bytes_max=2000) as producer:
        for i in range(1000):
            producer.send(topic_name, f"r{i:04d}".encode() * 4, partition=0)
        producer.flush(60)
    tp = TopicPartition(topic_name, 0)
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        first = consumer.poll_batches(timeout_ms=5000)
    assert len(first) > 2 and first[0].base_offset == 0 and 10 < len(first[0]) < 200, "batches of some tens of records"
    end = len(first[0]) // 2  # inside the first batch, which the same fetch answer follows with more
    df = reader(spark, cluster, subscribe=topic_name, endingOffsets=json.dumps({topic_name: {"0": end}}))
    assert [o for _, o, _ in rows(df)] == list(range(end))
    split = reader(spark, cluster, subscribe=topic_name, maxRecordsPerPartition="333")
    assert split.rdd.getNumPartitions() == 4
    assert [o for _, o, _ in rows(split)] == list(range(1000))


def test_user_schema_and_misspelt_options_are_clear_errors(spark: Any, cluster: LocalCluster, three: str) -> None:
    """A schema given with .schema(...) used to fail in the tasks with Spark's "Return schema
    mismatch"; a misspelt option was ignored (here: the whole topic instead of nothing)."""
    with pytest.raises(Exception, match="fabric source has a fixed schema"):
        spark.read.format("fabric").schema("value binary").option("bootstrap", cluster.bootstrap) \
            .option("subscribe", three).load().collect()
    with pytest.raises(Exception, match="did you mean endingOffsets"):
        reader(spark, cluster, subscribe=three, endingOffset=json.dumps({three: {"0": 0, "1": 0, "2": 0}})).collect()


def test_a_bad_stream_option_is_refused_at_load_and_reported_plainly(spark: Any, cluster: LocalCluster, three: str,
                                                                    tmp_path: Path) -> None:
    """A bad option on a stream was refused only once the query ran, and PySpark's stream
    runner then ended the report with an UnboundLocalError of its own under the message.
    Now load() refuses it, as it does for a batch read (and as Kafka's source does); the one
    rule only a stream has is reported when the query starts, without PySpark's error."""
    with pytest.raises(Exception, match="did you mean startingOffsets"):
        stream(spark, cluster, three, startingOffset="earliest")
    with pytest.raises(Exception, match="option startingOffsets must be earliest, latest or JSON"):
        stream(spark, cluster, three, startingOffsets="first")
    query = start_memory_query(stream(spark, cluster, three, endingOffsets="latest"), "stream_ending", tmp_path)
    try:
        with pytest.raises(Exception, match="option endingOffsets is for batch queries") as refused:
            query.processAllAvailable()
        assert "UnboundLocalError" not in str(refused.value)
    finally:
        query.stop()


def test_a_pattern_never_matches_internal_topics(spark: Any, cluster: LocalCluster, topic_name: str) -> None:
    """``subscribePattern`` read Fabric's own ``__consumer_offsets`` when it matched (``.*``
    did), where Kafka's source and the SDK's pattern subscriptions (docs/GROUPS.md) skip
    internal topics; naming one in ``subscribe`` still reads it."""
    create_topic(cluster.bootstrap, topic_name, 1)
    produce(cluster.bootstrap, topic_name, values("v", 3))
    with Consumer(cluster.bootstrap, group_id=f"{topic_name}-group", auto_offset_reset="earliest") as consumer:
        consumer.subscribe([topic_name])  # its commit creates __consumer_offsets
        polled = 0
        for _ in range(30):  # a bound, not a sleep: the group's join takes a few polls
            polled += len(consumer.poll(timeout_ms=1000))
            if polled == 3:
                break
        consumer.commit()
    matched = reader(spark, cluster, subscribePattern=f"__.*|{topic_name}").select("topic").distinct().collect()
    assert [r.topic for r in matched] == [topic_name]
    assert reader(spark, cluster, subscribe="__consumer_offsets").count() > 0

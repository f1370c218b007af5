"""Writing: every Spark task sends its rows with its own producer.

Batch writes are at-least-once (a retried task sends its rows again). Streaming writes are
exactly-once with the idempotent producer: a task's producer id is derived from the sink,
the micro-batch id and the Spark partition id, so a retried task, or the same micro-batch
re-run after a restart, sends the same records with the same (producer id, sequence)
pairs, and the node acknowledges them as duplicates without writing them again. Batch
boundaries must be the same on every attempt for that, so batches are cut only by size
(a linger longer than any task) and by the final flush. See docs/SPARK.md for the limits.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from fabric import errors
from sdk import Admin, Producer
from spark_connector import _options as opts

log = logging.getLogger("fabric.spark")

PRODUCER_ID_BITS = 62
EXACTLY_ONCE_LINGER_MS = 24 * 3600 * 1000  # longer than any task: batches close by size or flush only
FLUSH_TIMEOUT_S = 300.0
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark on every micro-batch job
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # stable across restarts (kept in the checkpoint)


@dataclass
class FabricCommitMessage(WriterCommitMessage):
    records: int
    partition_id: int
    producer_id: int  # -1 when not idempotent


def producer_id_for(sink_id: str, batch_id: int, partition_id: int) -> int:
    """A 62-bit id from (sink, micro-batch, Spark partition): equal for every attempt of one task."""
    digest = hashlib.blake2b(f"{sink_id}\x00{batch_id}\x00{partition_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << PRODUCER_ID_BITS) - 1)


def idempotence_available() -> bool:
    return "enable_idempotence" in inspect.signature(Producer.__init__).parameters


class _WriteConfig:
    """Write options and input columns, checked once on the driver."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        opts.check_known(options, opts.WRITE_OPTIONS, "write")
        self.bootstrap = opts.bootstrap_from(options)
        self.topic = opts._get(options, "topic")
        self.acks = (opts._get(options, "acks") or "all").strip().lower()
        if self.acks not in ("0", "1", "all", "-1"):
            raise opts.FabricOptionError(f"option acks must be 0, 1 or all, got {self.acks!r}")
        self.compression = (opts._get(options, "compression") or "lz4").strip().lower()
        if self.compression not in ("lz4", "none"):
            raise opts.FabricOptionError(f"option compression must be lz4 or none, got {self.compression!r}")
        self.linger_ms = opts.parse_int(options, "lingerMs", 5, minimum=0)
        self.batch_bytes_max = opts.parse_int(options, "batchBytesMax", 256 * 1024)
        # Not the checkpoint location: a query restarted from scratch at the same location
        # (checkpoint deleted) counts its micro-batches from 0 again, and would take the
        # producer ids of the old query's batches, whose records the node then acknowledges
        # as duplicates without writing them. The query id (write()) is new for a new checkpoint.
        self.sink_id = opts._get(options, "sinkId")
        self.exactly_once = opts.parse_bool(options, "exactlyOnce", True)
        fields = {f.name: f.dataType for f in schema.fields}
        if "value" not in fields:
            raise opts.FabricOptionError(
                f"writing to fabric needs a 'value' column (binary or string); the columns are {sorted(fields)}")
        for name in ("value", "key"):
            if name in fields and not isinstance(fields[name], (BinaryType, StringType)):
                raise opts.FabricOptionError(f"column {name!r} must be binary or string, not {fields[name].simpleString()}")
        if "topic" in fields and not isinstance(fields["topic"], StringType):
            raise opts.FabricOptionError(f"column 'topic' must be string, not {fields['topic'].simpleString()}")
        if "partition" in fields and not isinstance(fields["partition"], (IntegerType, LongType, ShortType)):
            raise opts.FabricOptionError(f"column 'partition' must be an integer, not {fields['partition'].simpleString()}")
        if "headers" in fields and not _headers_type_ok(fields["headers"]):
            raise opts.FabricOptionError(
                "column 'headers' must be array<struct<key: string, value: binary or string>>, "
                f"not {fields['headers'].simpleString()}")
        if self.topic is None and "topic" not in fields:
            raise opts.FabricOptionError("give the target topic: option topic, or a 'topic' column")
        self.columns = [name for name in ("key", "value", "topic", "partition", "headers") if name in fields]

    def check_topic(self) -> None:
        """On the driver, before any task starts: an unknown ``topic`` option fails the write
        with a plain message, instead of every task failing (after the producer's wait for the
        topic to appear) and Spark retrying it. A ``topic`` column is checked by the tasks."""
        if self.topic is None:
            return
        with Admin(self.bootstrap) as admin:
            try:
                admin.describe_topic(self.topic)
            except errors.UnknownTopicOrPartitionError:
                raise opts.FabricOptionError(
                    f"unknown topic {self.topic!r} (option topic); create it first or fix the option") from None

    def producer(self, producer_id: int | None = None) -> Producer:
        if producer_id is None:
            return Producer(self.bootstrap, acks=self.acks, linger_ms=self.linger_ms,
                            batch_bytes_max=self.batch_bytes_max, compression=self.compression)
        kwargs: dict[str, Any] = {"enable_idempotence": True, "producer_id": producer_id, "producer_epoch": 0}
        return Producer(self.bootstrap, acks="all", linger_ms=EXACTLY_ONCE_LINGER_MS,
                        batch_bytes_max=self.batch_bytes_max, compression=self.compression, **kwargs)


def _headers_type_ok(data_type: Any) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    inner = {f.name: f.dataType for f in data_type.elementType.fields}
    return (set(inner) == {"key", "value"} and isinstance(inner["key"], StringType)
            and isinstance(inner["value"], (BinaryType, StringType)))


def _header_value(value: Any) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


def send_all(config: _WriteConfig, producer: Producer, batches: Iterator[pa.RecordBatch],
             keyless_seed: int | None = None) -> int:
    """Send every row in order, flush, and raise the first delivery error. Returns the row count.

    ``keyless_seed`` (exactly-once): rows with neither a key nor a partition go to partition
    ``(keyless_seed + i) % count`` for the i-th Arrow batch, not to the producer's sticky
    partition, whose start is random per producer: a re-run task must send every record to
    the same partition (with the same sequence numbers) as its first attempt, or the node
    refuses it (OUT_OF_ORDER_SEQUENCE) or writes it twice."""
    futures = []
    count = 0
    topic_option = config.topic
    send = producer.send
    bulk_futures = []
    partition_counts: dict[str, int] = {}

    def keyless_partition(topic: str, turn: int) -> int | None:
        if keyless_seed is None:
            return None
        if topic not in partition_counts:
            partition_counts[topic] = producer.partitions_for(topic)
        return (keyless_seed + turn) % partition_counts[topic]

    for turn, batch in enumerate(batches):
        n = batch.num_rows
        if n == 0:
            continue
        keys_with_nulls = "key" in config.columns and batch.column("key").null_count > 0
        if topic_option is not None and "partition" not in config.columns \
                and not (keys_with_nulls and keyless_seed is not None):
            # One topic, partitions by key or sticky: the Arrow columns go to the producer
            # as they are (Producer.send_batch), no Python object per row. (Exactly-once
            # with some null keys takes the per-row path: send_batch spreads null keys
            # stickily, from a random start, and a re-run must place them as before.)
            bulk_headers = None
            if "headers" in config.columns:
                bulk_headers = [None if h is None else [(item["key"], _header_value(item["value"])) for item in h]
                                for h in batch.column("headers").to_pylist()]
            keys_column = batch.column("key") if "key" in config.columns else None
            bulk_futures.append(producer.send_batch(
                topic_option, batch.column("value"), keys=keys_column, headers=bulk_headers,
                partition=keyless_partition(topic_option, turn) if keys_column is None else None))
            count += n
            continue
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in config.columns else [None] * n
        if topic_option is not None:
            topics: list[Any] = [topic_option] * n
        else:
            topics = batch.column("topic").to_pylist()
        partitions = batch.column("partition").to_pylist() if "partition" in config.columns else [None] * n
        if "headers" in config.columns:
            headers: list[Any] = [
                None if h is None else [(item["key"], item["value"]) for item in h]
                for h in batch.column("headers").to_pylist()
            ]
        else:
            headers = [None] * n
        for topic, value, key, partition, header in zip(topics, values, keys, partitions, headers, strict=True):
            if topic is None:
                raise opts.FabricOptionError("a row has a null 'topic' and no topic option is set")
            if partition is None and key is None and keyless_seed is not None:
                partition = keyless_partition(topic, turn)
            futures.append(send(topic, value, key=key, headers=header, partition=partition))
        count += n
    producer.flush(FLUSH_TIMEOUT_S)
    for bulk_future in bulk_futures:
        exc = bulk_future.exception(0)
        if exc is not None:
            raise exc
    seen: set[int] = set()
    for future in futures:
        batch_result = id(future._batch)  # one check per batch, not per record
        if batch_result in seen:
            continue
        seen.add(batch_result)
        exc = future.exception(0)
        if exc is not None:
            raise exc
    return count


class FabricBatchWriter(DataSourceArrowWriter):
    """``df.write.format("fabric")``: at-least-once (a retried task sends its rows again)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.config = _WriteConfig(options, schema)
        self.config.check_topic()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FabricCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else -1
        producer = self.config.producer()
        try:
            count = send_all(self.config, producer, iterator)
        finally:
            producer.close()
        return FabricCommitMessage(count, partition_id, -1)


class FabricStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("fabric")``: exactly-once per micro-batch (see the module doc)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.config = _WriteConfig(options, schema)
        self.config.check_topic()
        self.idempotent = self.config.exactly_once and idempotence_available()
        if self.config.exactly_once and not self.idempotent:
            log.warning("this SDK has no idempotent producer: the fabric sink is at-least-once")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FabricCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise RuntimeError("FabricStreamWriter.write runs inside a Spark task")
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        # The query id is kept in the checkpoint: the same for every attempt and restart of
        # this query, new for a new checkpoint (see _WriteConfig.sink_id).
        sink_id = "\x00".join(part for part in (self.config.sink_id, context.getLocalProperty(QUERY_ID_PROPERTY))
                               if part) or None
        return self.write_task(iterator, batch_id=int(batch_id) if batch_id is not None else None,
                               partition_id=context.partitionId(), sink_id=sink_id)

    def write_task(self, iterator: Iterator[pa.RecordBatch], *, batch_id: int | None, partition_id: int,
                   sink_id: str | None) -> FabricCommitMessage:
        """One task's write; a second call with the same arguments and rows writes nothing new."""
        producer_id = -1
        if self.idempotent:
            if batch_id is None or sink_id is None:
                raise RuntimeError(
                    f"exactly-once needs the micro-batch id and a sink id (batch id {batch_id!r}, sink id {sink_id!r}); "
                    "set the option sinkId")
            producer_id = producer_id_for(sink_id, batch_id, partition_id)
        producer = self.config.producer(producer_id if producer_id >= 0 else None)
        try:
            count = send_all(self.config, producer, iterator, producer_id if producer_id >= 0 else None)
        finally:
            producer.close()
        return FabricCommitMessage(count, partition_id, producer_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        records = sum(m.records for m in messages if isinstance(m, FabricCommitMessage))
        log.debug("micro-batch %d: %d records written", batchId, records)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Records of the failed attempt may be in the topic already; the re-run of this
        # micro-batch uses the same producer ids, so they are not written twice.
        log.warning("micro-batch %d aborted; its re-run will not duplicate what was written", batchId)

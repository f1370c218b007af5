"""Reading: plan offset ranges on the driver, fetch them as Arrow record batches in tasks.

The driver side (``_ClusterView``) lists partitions and offsets; it lives in the reader
object on the driver and is never pickled. A task gets a ``FabricInputPartition`` that
carries everything it needs (node addresses, the range, the options that matter) and
reads with its own ``sdk.Consumer``; executors never depend on driver-side state.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from fabric import errors
from sdk import Admin, Consumer, RecordBatch, TopicPartition
from spark_connector._options import (
    EARLIEST,
    LATEST,
    DataLossError,
    FabricOptionError,
    OffsetsSpec,
    TopicSelection,
    spec_offset,
    split_range,
)

log = logging.getLogger("fabric.spark")

ARROW_BATCH_ROWS = 200_000  # rows per Arrow batch handed to Spark: big batches halve its per-row cost
TIMESTAMP_TYPE_CREATE = 0  # Kafka's numbering: 0 CreateTime, 1 LogAppendTime

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)]), True
)


def read_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE, True))
    return StructType(fields)


def arrow_schema(include_headers: bool) -> pa.Schema:
    # Spark checks a returned batch against exactly this conversion of the declared schema.
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(read_schema(include_headers), timezone="UTC")


class FabricInputPartition(InputPartition):
    """One offset range [start, end) of one fabric partition: all a task needs to read it."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        bootstrap: str,
        node_addresses: tuple[str, ...],
        include_headers: bool,
        fail_on_data_loss: bool,
        poll_timeout_ms: int,
    ) -> None:
        super().__init__(None)
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.bootstrap = bootstrap
        self.node_addresses = node_addresses
        self.include_headers = include_headers
        self.fail_on_data_loss = fail_on_data_loss
        self.poll_timeout_ms = poll_timeout_ms


# -- driver side ------------------------------------------------------------------------------
class _ClusterView:
    """Partition discovery and offset look-ups for the planner (driver only, not picklable)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._admin: Admin | None = None
        self._consumer: Consumer | None = None

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.bootstrap)
        return self._admin

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.bootstrap, auto_offset_reset="none")
        return self._consumer

    def partitions(self, selection: TopicSelection, *, missing_ok: bool = False) -> list[TopicPartition]:
        """The selected partitions that exist now, sorted. Unknown named topics raise."""
        if selection.pattern is not None:
            regex = re.compile(selection.pattern)
            topics = [t for t in self.admin.list_topics() if regex.fullmatch(t)]
        else:
            topics = sorted({tp.topic for tp in selection.assigned} or set(selection.topics))
        out: list[TopicPartition] = []
        for topic in topics:
            try:
                count = len(self.admin.describe_topic(topic).partitions)
            except errors.UnknownTopicOrPartitionError:
                if missing_ok or selection.pattern is not None:
                    continue  # a pattern match deleted meanwhile
                raise FabricOptionError(
                    f"unknown topic {topic!r} ({selection.describe()}); create it first or fix the option"
                ) from None
            if selection.assigned:
                wanted = [tp for tp in selection.assigned if tp.topic == topic]
                absent = [tp for tp in wanted if tp.partition >= count]
                if absent and not missing_ok:
                    raise FabricOptionError(
                        f"option assign names partitions that do not exist: {', '.join(map(str, absent))} "
                        f"(topic {topic!r} has {count})"
                    )
                out.extend(tp for tp in wanted if tp.partition < count)
            else:
                out.extend(TopicPartition(topic, p) for p in range(count))
        return sorted(out, key=lambda tp: (tp.topic, tp.partition))

    def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        self.consumer.assign(list(tps))
        return self.consumer.beginning_offsets(list(tps))

    def latest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        self.consumer.assign(list(tps))
        return self.consumer.end_offsets(list(tps))

    def node_addresses(self) -> tuple[str, ...]:
        return tuple(address for _, address in sorted(self.admin.nodes().items()))

    def resolve(self, name: str, spec: OffsetsSpec, tps: Sequence[TopicPartition],
                earliest: dict[TopicPartition, int], latest: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Concrete offsets for a spec; a JSON offset past the end of the log is an error."""
        out: dict[TopicPartition, int] = {}
        for tp in tps:
            wanted = spec_offset(spec, tp)
            if wanted == EARLIEST:
                out[tp] = earliest[tp]
            elif wanted == LATEST:
                out[tp] = latest[tp]
            elif wanted > latest[tp]:
                raise FabricOptionError(
                    f"option {name}: offset {wanted} for {tp} is past the end of the partition (next offset {latest[tp]})"
                )
            else:
                out[tp] = wanted
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def plan_partitions(
    ranges: dict[TopicPartition, tuple[int, int]],
    *,
    bootstrap: str,
    node_addresses: tuple[str, ...],
    include_headers: bool,
    fail_on_data_loss: bool,
    poll_timeout_ms: int,
    max_records_per_partition: int,
    min_partitions: int | None,
) -> list[FabricInputPartition]:
    """One input partition per range, large ranges split so no task gets a giant range."""
    total = sum(max(0, end - start) for start, end in ranges.values())
    limit = max_records_per_partition
    if min_partitions and total:
        limit = max(1, min(limit, -(-total // min_partitions)))
    out: list[FabricInputPartition] = []
    for tp in sorted(ranges, key=lambda tp: (tp.topic, tp.partition)):
        start, end = ranges[tp]
        for s, e in split_range(start, end, limit):
            out.append(FabricInputPartition(
                tp.topic, tp.partition, s, e, bootstrap=bootstrap, node_addresses=node_addresses,
                include_headers=include_headers, fail_on_data_loss=fail_on_data_loss, poll_timeout_ms=poll_timeout_ms,
            ))
    return out


# -- task side ----------------------------------------------------------------------------------
def _report_data_loss(part: FabricInputPartition, message: str) -> None:
    if part.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Some data may have been lost. Set the option failOnDataLoss to false "
            "to log a warning and continue instead."
        )
    log.warning("%s; continuing because failOnDataLoss=false", message)


def _open_consumer(part: FabricInputPartition) -> Consumer:
    """A consumer on the node addresses the planner saw; the user's bootstrap if none answers."""
    if part.node_addresses:
        consumer = Consumer(",".join(part.node_addresses), auto_offset_reset="none")
        try:
            consumer.assign([TopicPartition(part.topic, part.partition)])
            return consumer
        except errors.FabricError as exc:
            consumer.close()
            log.info("planned node addresses failed (%s); using bootstrap %s", exc, part.bootstrap)
    consumer = Consumer(part.bootstrap, auto_offset_reset="none")
    try:
        consumer.assign([TopicPartition(part.topic, part.partition)])
    except BaseException:
        consumer.close()
        raise
    return consumer


class _ArrowColumns:
    """Columns of consecutive records of one partition, turned into one Arrow batch."""

    def __init__(self, part: FabricInputPartition, schema: pa.Schema) -> None:
        self.part = part
        self.schema = schema
        self.topic = pa.scalar(part.topic, pa.string())
        self.partition = pa.scalar(part.partition, pa.int32())
        self.timestamp_type = pa.scalar(TIMESTAMP_TYPE_CREATE, pa.int32())
        self._reset(-1)

    def _reset(self, next_offset: int) -> None:
        self.first_offset = next_offset
        self.next_offset = next_offset
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[list[tuple[str, bytes | None]]] = []

    @property
    def rows(self) -> int:
        return len(self.values)

    def contiguous(self, base_offset: int) -> bool:
        return not self.values or base_offset == self.next_offset

    def add(self, batch: RecordBatch, count: int) -> None:
        if not self.values:
            self.first_offset = batch.base_offset
        whole = count == len(batch)
        self.keys.extend(batch.keys if whole else batch.keys[:count])
        self.values.extend(batch.values if whole else batch.values[:count])
        self.timestamps.extend(batch.timestamps if whole else batch.timestamps[:count])
        if self.part.include_headers:
            self.headers.extend(batch.headers if whole else batch.headers[:count])
        self.next_offset = batch.base_offset + count

    def build(self) -> pa.RecordBatch:
        n = len(self.values)
        columns: list[Any] = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(self.topic, n),
            pa.repeat(self.partition, n),
            pa.array(np.arange(self.first_offset, self.first_offset + n, dtype=np.int64)),
            pa.array(np.asarray(self.timestamps, dtype=np.int64) * 1000, pa.timestamp("us", tz="UTC")),
            pa.repeat(self.timestamp_type, n),
        ]
        if self.part.include_headers:
            columns.append(pa.array(self.headers, self.schema.field("headers").type))
        out = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self._reset(self.next_offset)
        return out


def read_partition(part: InputPartition) -> Iterator[pa.RecordBatch]:
    """Fetch [start, end) of one partition and yield it as Arrow record batches."""
    if not isinstance(part, FabricInputPartition) or part.end <= part.start:
        return
    schema = arrow_schema(part.include_headers)
    tp = TopicPartition(part.topic, part.partition)
    consumer = _open_consumer(part)
    try:
        position = part.start
        first = consumer.beginning_offsets([tp])[tp]
        if first > position:
            _report_data_loss(part, f"offsets {position}..{min(first, part.end) - 1} of {tp} were deleted "
                                    f"(the log now starts at {first}) before the query read them")
            position = first
        if position >= part.end:
            return
        consumer.seek(tp, position)
        columns = _ArrowColumns(part, schema)
        idle_deadline = time.monotonic() + part.poll_timeout_ms / 1000.0
        while position < part.end:
            try:
                batches = consumer.poll_batches(timeout_ms=1000, max_records=part.end - position)
            except errors.OffsetOutOfRangeError:
                first = consumer.beginning_offsets([tp])[tp]
                if first <= position:
                    raise
                _report_data_loss(part, f"offsets {position}..{min(first, part.end) - 1} of {tp} were deleted "
                                        "while the query was reading them")
                position = first
                if position < part.end:
                    consumer.seek(tp, position)
                continue
            if not batches:
                if time.monotonic() > idle_deadline:
                    raise errors.RequestTimedOutError(
                        f"{tp}: no record at offset {position} within pollTimeoutMs={part.poll_timeout_ms} "
                        f"(planned range {part.start}..{part.end - 1})"
                    )
                continue
            idle_deadline = time.monotonic() + part.poll_timeout_ms / 1000.0
            for batch in batches:
                if batch.base_offset < position:
                    raise errors.CorruptMessageError(f"{tp}: got offset {batch.base_offset}, expected {position}")
                if batch.base_offset > position:
                    _report_data_loss(part, f"offsets {position}..{batch.base_offset - 1} of {tp} are missing")
                count = min(len(batch), part.end - batch.base_offset)
                if count <= 0:
                    position = part.end
                    break
                if not columns.contiguous(batch.base_offset):
                    yield columns.build()
                columns.add(batch, count)
                position = batch.base_offset + count
                if columns.rows >= ARROW_BATCH_ROWS:
                    yield columns.build()
        if columns.rows:
            yield columns.build()
    finally:
        consumer.close()

"""Reading: plan offset ranges on the driver, fetch them as Arrow record batches in tasks.

The driver side (``_ClusterView``) lists partitions and offsets; it lives in the reader
object on the driver and is never pickled. A task gets a ``FabricInputPartition`` that
carries everything it needs (node addresses, the range, the options that matter) and
reads with its own ``sdk.Consumer``; executors never depend on driver-side state.
"""

from __future__ import annotations

import logging
import re
import struct
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
from fabric.protocol.apis import is_internal_topic
from fabric.protocol.batch import (
    ATTRIBUTE_CONTROL,
    TIMESTAMP_LOG_APPEND,
    ColumnView,
    column_view,
    read_header,
)
from sdk import Admin, Consumer, TopicPartition
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
ARROW_BATCH_BYTES = 64 * 1024 * 1024  # and at most about this many key + value bytes (int32 Arrow offsets)
TIMESTAMP_TYPE_CREATE = 0  # Kafka's numbering: 0 CreateTime, 1 LogAppendTime
TIMESTAMP_TYPE_LOG_APPEND = 1
CHECK_CRC = True  # tasks check every batch's CRC, as sdk.Consumer does by default

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)]), True
)


def read_schema(include_headers: bool, include_global_id: bool = False) -> StructType:
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
    if include_global_id:  # strict-order topics: the record's global ID (null elsewhere)
        fields.append(StructField("global_id", LongType(), True))
    return StructType(fields)


def arrow_schema(include_headers: bool, include_global_id: bool = False) -> pa.Schema:
    # Spark checks a returned batch against exactly this conversion of the declared schema.
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(read_schema(include_headers, include_global_id), timezone="UTC")


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
        include_global_id: bool = False,
    ) -> None:
        super().__init__(None)
        self.include_global_id = include_global_id
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
            # Never Fabric's own __consumer_offsets and __queue_state: Kafka's source (its
            # consumer excludes internal topics) and the SDK's pattern subscriptions skip them.
            topics = [t for t in self.admin.list_topics() if not is_internal_topic(t) and regex.fullmatch(t)]
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
    include_global_id: bool = False,
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
                include_global_id=include_global_id,
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


class _Chunk:
    """Records ``[skip, count)`` of one fetched batch, located in its records section.

    Nothing per record: the length columns are numpy views of the records section
    (zero-copy), the key and value bytes are one contiguous region each.
    """

    __slots__ = ("base_offset", "count", "first_timestamp", "global_id_base", "headers_start", "key_lengths", "keys",
                 "n", "records", "skip", "timestamp_deltas", "timestamp_type", "value_lengths", "values")

    def __init__(self, view: ColumnView, skip: int, count: int) -> None:
        header = view.header
        n = header.record_count
        records = view.records
        # column_view checked that the section holds the four length columns and that the
        # key and value lengths are >= -1 and fit; the same bytes as numpy arrays, no copy.
        lengths = np.frombuffer(records, dtype="<i4", count=3 * n)
        self.records = records
        self.n = n
        self.skip = skip
        self.count = count
        self.base_offset = header.base_offset
        self.global_id_base = header.global_id_base
        self.first_timestamp = header.first_timestamp
        self.timestamp_type = TIMESTAMP_TYPE_LOG_APPEND if header.attributes & TIMESTAMP_LOG_APPEND \
            else TIMESTAMP_TYPE_CREATE
        self.timestamp_deltas = lengths[skip:count]
        self.key_lengths = lengths[n + skip : n + count]
        self.value_lengths = lengths[2 * n + skip : 2 * n + count]
        self.keys = _region(records, view.keys_start, lengths[n : 2 * n], skip, count)
        self.values = _region(records, view.values_start, lengths[2 * n : 3 * n], skip, count)
        self.headers_start = view.headers_start

    @property
    def rows(self) -> int:
        return self.count - self.skip

    @property
    def data_bytes(self) -> int:
        return len(self.keys) + len(self.values)

    def headers(self) -> tuple[np.ndarray, list[str], list[bytes | None]]:
        """Header counts of records [skip, count) and their headers' names and values, flat."""
        n = self.n
        counts = np.frombuffer(self.records, dtype="<u2", count=n, offset=3 * 4 * n)
        before = int(counts[: self.skip].sum())
        total = int(counts[: self.count].sum())
        names, values = _parse_headers(self.records, self.headers_start, total, before)
        return counts[self.skip : self.count], names, values


def _region(records: bytes, start: int, lengths: np.ndarray, skip: int, count: int) -> memoryview:
    """The concatenated bytes of items [skip, count) of a column that begins at ``start``."""
    sizes = np.maximum(lengths[:count], 0)
    begin = start + int(sizes[:skip].sum())
    return memoryview(records)[begin : begin + int(sizes[skip:].sum())]


_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")


def _parse_headers(records: bytes, pos: int, total: int, first: int) -> tuple[list[str], list[bytes | None]]:
    """Headers number ``first`` to ``total - 1`` of a records section (wire format: u16 name
    length, name, i32 value length or -1, value); the ones before are walked over."""
    names: list[str] = []
    values: list[bytes | None] = []
    end = len(records)
    for i in range(total):
        if pos + 2 > end:
            raise errors.CorruptMessageError("headers run past the records section")
        (name_len,) = _U16.unpack_from(records, pos)
        pos += 2
        name_end = pos + name_len
        if name_end + 4 > end:
            raise errors.CorruptMessageError("header name runs past the records section")
        (value_len,) = _I32.unpack_from(records, name_end)
        value_start = name_end + 4
        value_end = value_start + max(value_len, 0)
        if value_len < -1 or value_end > end:
            raise errors.CorruptMessageError(f"bad header value length {value_len}")
        if i >= first:
            try:
                names.append(records[pos:name_end].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise errors.CorruptMessageError(f"header name is not UTF-8: {exc}") from None
            values.append(None if value_len < 0 else records[value_start:value_end])
        pos = value_end
    return names, values


def _binary_array(lengths: np.ndarray, regions: list[memoryview]) -> pa.Array:
    """An Arrow binary array straight from a length column (-1 = null) and the bytes."""
    n = len(lengths)
    valid = lengths >= 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.where(valid, lengths, 0), out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{offsets[-1]} bytes do not fit one Arrow binary array")  # ARROW_BATCH_BYTES prevents it
    nulls = n - int(np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    data = pa.py_buffer(regions[0] if len(regions) == 1 else b"".join(regions))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets.astype(np.int32)), data],
                                 null_count=nulls)


class _ArrowBuilder:
    """Chunks of one partition, turned into one Arrow record batch with columnar operations only."""

    def __init__(self, part: FabricInputPartition, schema: pa.Schema) -> None:
        self.part = part
        self.schema = schema
        self.topic = pa.scalar(part.topic, pa.string())
        self.partition = pa.scalar(part.partition, pa.int32())
        self.chunks: list[_Chunk] = []
        self.rows = 0
        self.data_bytes = 0

    def add(self, chunk: _Chunk) -> None:
        self.chunks.append(chunk)
        self.rows += chunk.rows
        self.data_bytes += chunk.data_bytes

    @property
    def full(self) -> bool:
        return self.rows >= ARROW_BATCH_ROWS or self.data_bytes >= ARROW_BATCH_BYTES

    def build(self) -> pa.RecordBatch:
        chunks, n = self.chunks, self.rows

        def cat(arrays: list[np.ndarray]) -> np.ndarray:
            return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

        offsets = cat([np.arange(c.base_offset + c.skip, c.base_offset + c.count, dtype=np.int64) for c in chunks])
        timestamps = cat([(c.timestamp_deltas.astype(np.int64) + c.first_timestamp) * 1000 for c in chunks])
        kinds = {c.timestamp_type for c in chunks}
        if len(kinds) == 1:
            timestamp_type: pa.Array = pa.repeat(pa.scalar(kinds.pop(), pa.int32()), n)
        else:
            timestamp_type = pa.array(cat([np.full(c.rows, c.timestamp_type, dtype=np.int32) for c in chunks]))
        columns: list[Any] = [
            _binary_array(cat([c.key_lengths for c in chunks]), [c.keys for c in chunks]),
            _binary_array(cat([c.value_lengths for c in chunks]), [c.values for c in chunks]),
            pa.repeat(self.topic, n),
            pa.repeat(self.partition, n),
            pa.array(offsets),
            pa.array(timestamps, pa.timestamp("us", tz="UTC")),
            timestamp_type,
        ]
        if self.part.include_headers:
            columns.append(self._headers(chunks))
        if getattr(self.part, "include_global_id", False):
            columns.append(_global_ids(chunks))
        out = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self.chunks, self.rows, self.data_bytes = [], 0, 0
        return out

    def _headers(self, chunks: list[_Chunk]) -> pa.Array:
        counts: list[np.ndarray] = []
        names: list[str] = []
        values: list[bytes | None] = []
        for chunk in chunks:
            c, k, v = chunk.headers()
            counts.append(c)
            names.extend(k)
            values.extend(v)
        list_offsets = np.zeros(self.rows + 1, dtype=np.int32)
        np.cumsum(np.concatenate(counts), out=list_offsets[1:])
        list_type = self.schema.field("headers").type
        items = pa.StructArray.from_arrays([pa.array(names, pa.string()), pa.array(values, pa.binary())],
                                           fields=list(list_type.value_type))
        return pa.ListArray.from_arrays(pa.array(list_offsets), items, type=list_type)


def _global_ids(chunks: list[_Chunk]) -> pa.Array:
    """Record i of a chunk has global ID global_id_base + i; null where the batch has none."""
    parts: list[pa.Array] = []
    for c in chunks:
        if c.global_id_base >= 0:
            parts.append(pa.array(np.arange(c.global_id_base + c.skip, c.global_id_base + c.count, dtype=np.int64)))
        else:
            parts.append(pa.nulls(c.rows, pa.int64()))
    return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)


def read_partition(part: InputPartition) -> Iterator[pa.RecordBatch]:
    """Fetch [start, end) of one partition and yield it as Arrow record batches."""
    if not isinstance(part, FabricInputPartition) or part.end <= part.start:
        return
    schema = arrow_schema(part.include_headers, getattr(part, "include_global_id", False))
    tp = TopicPartition(part.topic, part.partition)
    consumer = _open_consumer(part)
    consumer.skip_control_batches = False  # seen here, so a strict-order tick is not taken for lost data
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
        builder = _ArrowBuilder(part, schema)
        idle_deadline = time.monotonic() + part.poll_timeout_ms / 1000.0
        while position < part.end:
            try:
                batches = consumer.poll_raw_batches(timeout_ms=1000)
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
            for raw in batches:
                if position >= part.end:
                    break  # the range ended inside an earlier batch of this answer: the rest is not ours
                control = read_header(raw.buf)
                if control.attributes & ATTRIBUTE_CONTROL:  # a strict-order tick: an offset, no record
                    if control.base_offset + raw.skip > position:
                        _report_data_loss(part, f"offsets {position}..{control.base_offset + raw.skip - 1} of {tp} are missing")
                    position = min(control.next_offset, part.end)
                    continue
                view = column_view(raw.buf, check_crc=CHECK_CRC)
                base = view.header.base_offset
                first_new = base + raw.skip
                if first_new < position:
                    raise errors.CorruptMessageError(f"{tp}: got offset {first_new}, expected {position}")
                if first_new > position:
                    _report_data_loss(part, f"offsets {position}..{first_new - 1} of {tp} are missing")
                count = min(view.header.record_count, part.end - base)
                if count <= raw.skip:
                    position = part.end
                    break
                builder.add(_Chunk(view, raw.skip, count))
                position = base + count
                if builder.full:
                    yield builder.build()
        if builder.rows:
            yield builder.build()
    finally:
        consumer.close()

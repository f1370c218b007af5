"""``Producer.send_batch``: records that arrive as columns go out as columns.

A pipeline that already holds a column of values (a list, or an Arrow array from Spark or
a Parquet file) should not pay a Python call per record. ``Columns`` turns the input into
what the batch format stores anyway (little-endian i32 lengths and the bytes end to end,
docs/PROTOCOL.md section 4) and cuts it into batches of about ``batch_bytes_max``; Arrow
binary and string arrays are never split into Python objects: their offsets give the
lengths and their data buffer is the values section.

Pure logic, no I/O: the producer encodes, compresses and queues the pieces.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from fabric import errors
from fabric.limits import BATCH_HEADER_BYTES, BATCH_RECORDS_MAX
from fabric.protocol import batch as batch_format
from sdk.accumulator import (
    RECORD_OVERHEAD_BYTES,
    BatchResult,
    Headers,
    as_bytes,
    headers_bytes,
    normalize_headers,
)

_NULL_LENGTH = (-1).to_bytes(4, "little", signed=True)


class _Column:
    """One column (values or keys): lengths (-1 = null) and bytes, sliceable by record."""

    def __init__(self, data: Any, what: str) -> None:
        self.what = what
        self.arrow: Any = None
        if hasattr(data, "__arrow_c_array__") or hasattr(data, "combine_chunks"):
            self._from_arrow(data)
            return
        if isinstance(data, (str, bytes, bytearray, memoryview)) or not isinstance(data, Sequence):
            raise TypeError(f"{what} must be a sequence (list, tuple) of bytes/str/None or an Arrow array, "
                            f"not {type(data).__name__}")
        items = list(data)
        try:
            b"".join(items)  # every item is bytes: the common case, checked at C speed
        except TypeError:
            items = [as_bytes(item, f"{what} items") for item in items]
        self.items: list[bytes | None] = items
        self.has_nulls = None in items if items else False
        lengths = [-1 if v is None else len(v) for v in items] if self.has_nulls else list(map(len, items))
        self.lengths = lengths
        self.count = len(items)

    def _from_arrow(self, data: Any) -> None:
        import pyarrow as pa  # only when the caller passes Arrow data
        import pyarrow.compute as pc

        if isinstance(data, pa.ChunkedArray):
            data = data.combine_chunks()
        if not isinstance(data, pa.Array):
            data = pa.array(data)
        kind = data.type
        if pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
            data = data.cast(pa.binary() if pa.types.is_large_binary(kind) else pa.string())
        elif not (pa.types.is_binary(kind) or pa.types.is_string(kind)):
            raise TypeError(f"{self.what} must be an Arrow binary or string array, not {kind}")
        self.arrow = data
        self.count = len(data)
        self.has_nulls = data.null_count > 0
        lengths = pc.binary_length(data)
        self.arrow_lengths = pc.fill_null(lengths, -1) if self.has_nulls else lengths
        offsets = data.buffers()[1]
        self.offsets = memoryview(offsets).cast("i")[data.offset : data.offset + self.count + 1]
        self.data_buffer = data.buffers()[2]

    def lengths_list(self) -> list[int]:
        return self.arrow_lengths.to_pylist() if self.arrow is not None else self.lengths

    def max_length(self) -> int:
        if self.count == 0:
            return 0
        if self.arrow is not None:
            import pyarrow.compute as pc

            return max(int(pc.max(self.arrow_lengths).as_py() or 0), 0)
        return max(max(self.lengths), 0)

    def total_bytes(self, start: int, end: int) -> int:
        if self.arrow is not None:
            return self.offsets[end] - self.offsets[start]
        return self.cumulative[end] - self.cumulative[start]

    @property
    def cumulative(self) -> list[int]:
        cum = getattr(self, "_cumulative", None)
        if cum is None:
            lengths = [n if n > 0 else 0 for n in self.lengths] if self.has_nulls else self.lengths
            cum = self._cumulative = list(accumulate(lengths, initial=0))
        return cum

    def lengths_bytes(self, start: int, end: int) -> bytes:
        if self.arrow is not None:
            piece = self.arrow_lengths.slice(start, end - start)
            buf = piece.buffers()[1]
            return memoryview(buf)[piece.offset * 4 : (piece.offset + end - start) * 4].tobytes()
        return array("i", self.lengths[start:end]).tobytes()

    def blob(self, start: int, end: int) -> bytes | memoryview:
        if self.arrow is not None:
            if self.data_buffer is None:
                return b""
            return memoryview(self.data_buffer)[self.offsets[start] : self.offsets[end]]
        items = self.items[start:end]
        if self.has_nulls:
            return b"".join([v for v in items if v is not None])
        return b"".join(items)  # type: ignore[arg-type]  # no None here: has_nulls is False

    def item(self, index: int) -> bytes | None:
        if self.arrow is not None:
            value = self.arrow[index].as_py()
            return value.encode("utf-8") if isinstance(value, str) else value
        return self.items[index]


@dataclass(frozen=True)
class Piece:
    """Records [start, end) of the input, bound for one partition as one batch."""

    partition: int
    records: bytes  # the records section, uncompressed
    record_count: int
    size_bytes: int  # what the piece counts against buffer_bytes_max
    tag_bloom: int | None


class Columns:
    """The validated input of one ``send_batch`` call."""

    def __init__(self, values: Any, keys: Any = None, headers: Sequence[Any] | None = None) -> None:
        self.values = _Column(values, "values")
        self.count = self.values.count
        self.keys = _Column(keys, "keys") if keys is not None else None
        if self.keys is not None and self.keys.count != self.count:
            raise ValueError(f"keys has {self.keys.count} items, values {self.count}")
        self.headers: list[Headers | None] | None = None
        if headers is not None:
            header_list = list(headers)
            if len(header_list) != self.count:
                raise ValueError(f"headers has {len(header_list)} items, values {self.count}")
            # Each record's headers as send() takes them: a dict or (name, value) pairs,
            # values bytes, str or None.
            self.headers = [normalize_headers(h) if h else None for h in header_list]
        # Per-record sizes only where they can differ from value length + overhead.
        self._extra: list[int] | None = None
        if self.keys is not None or self.headers is not None:
            key_lengths = self.keys.lengths_list() if self.keys is not None else None
            extra = [max(n, 0) for n in key_lengths] if key_lengths is not None else [0] * self.count
            if self.headers is not None:
                extra = [e + (headers_bytes(h) if h else 0) for e, h in zip(extra, self.headers, strict=True)]
            self._extra = [0, *accumulate(extra)]

    def size_bytes(self, start: int, end: int) -> int:
        """Bytes records [start, end) take in a batch (the producer's buffer accounting)."""
        size = self.values.total_bytes(start, end) + RECORD_OVERHEAD_BYTES * (end - start)
        if self._extra is not None:
            size += self._extra[end] - self._extra[start]
        return size

    def largest_record_bytes(self, limit_bytes: int) -> int:
        """The largest record's size, exactly when it may pass ``limit_bytes``; otherwise
        a bound (largest value + largest key and headers + overhead) is enough."""
        if self.count == 0:
            return 0
        bound = self.values.max_length() + RECORD_OVERHEAD_BYTES
        if self._extra is not None:
            bound += max(b - a for a, b in zip(self._extra, self._extra[1:], strict=False))
        if bound <= limit_bytes:
            return bound
        return max(self.size_bytes(i, i + 1) for i in range(self.count))

    def cut(self, start: int, end: int, batch_bytes_max: int) -> list[tuple[int, int]]:
        """Split records [start, end) into runs of at most ``batch_bytes_max`` bytes (a
        record larger than that gets a run of its own), at most BATCH_RECORDS_MAX each."""
        runs: list[tuple[int, int]] = []
        base = self.size_bytes(0, start)
        while start < end:
            # the first index whose prefix size passes the limit, by bisection over sizes
            limit = base + batch_bytes_max
            stop = bisect.bisect_right(_Prefix(self), limit, start + 1, end + 1) - 1
            stop = max(stop, start + 1)
            stop = min(stop, start + BATCH_RECORDS_MAX)
            runs.append((start, stop))
            base = self.size_bytes(0, stop)
            start = stop
        return runs

    def piece(self, partition: int, start: int, end: int) -> Piece:
        n = end - start
        if self.keys is not None:
            key_lengths, keys_blob = self.keys.lengths_bytes(start, end), self.keys.blob(start, end)
        else:
            key_lengths, keys_blob = _NULL_LENGTH * n, b""
        header_counts, header_bytes, bloom = None, b"", None
        if self.headers is not None:
            chunk = self.headers[start:end]
            if any(chunk):
                from fabric.protocol import tags as tags_format

                header_counts = array("H", [len(h) if h else 0 for h in chunk]).tobytes()
                header_bytes = batch_format.encode_headers(chunk)
                bloom = tags_format.batch_bloom(chunk)
        records = batch_format.encode_columns(n, key_lengths, keys_blob, self.values.lengths_bytes(start, end),
                                              self.values.blob(start, end), header_counts, header_bytes)
        return Piece(partition, records, n, self.size_bytes(start, end), bloom)

    def key(self, index: int) -> bytes | None:
        return self.keys.item(index) if self.keys is not None else None


class _Prefix(Sequence[int]):
    """prefix[i] = bytes of records [0, i): a sorted sequence bisect can search lazily."""

    def __init__(self, columns: Columns) -> None:
        self.columns = columns

    def __getitem__(self, index: Any) -> Any:
        return self.columns.size_bytes(0, index)

    def __len__(self) -> int:
        return self.columns.count + 1


@dataclass(frozen=True)
class BatchMetadata:
    topic: str
    partition: int
    base_offset: int  # -1 with acks=0
    record_count: int


class BulkFuture:
    """What ``Producer.send_batch`` returns: the batches the records went into, in input
    order per partition. ``result()`` waits for all of them and raises the first error."""

    __slots__ = ("_parts",)

    def __init__(self, parts: list[tuple[BatchResult, int]]) -> None:
        self._parts = parts  # (batch result, records of ours in it)

    def done(self) -> bool:
        return all(result.done for result, _ in self._parts)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        for result, _count in self._parts:
            if result.exception is not None:
                return result.exception
        return None

    def result(self, timeout: float | None = None) -> list[BatchMetadata]:
        exc = self.exception(timeout)
        if exc is not None:
            raise exc
        return [BatchMetadata(r.topic, r.partition, r.base_offset, count) for r, count in self._parts]

    def _wait(self, timeout: float | None) -> None:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        for result, _count in self._parts:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not result.wait(remaining):
                raise TimeoutError(f"records not acknowledged within {timeout} s")


def by_key(columns: Columns, partition_count: int, route: list[bytes | None] | None = None
           ) -> list[tuple[int, Columns]]:
    """Keyed records: split by partition (crc32 of the key, as ``send``), keeping order.
    Null keys form the group of target -1: the sticky partitioner's, as ``send(key=None)``
    (they all went to partition 0 once, piling onto one partition). ``route``: the bytes
    each record goes by instead of its key (a queue message's dedup id when it has no key)."""
    from fabric.protocol.keyhash import partition_for_key

    keys = [columns.key(i) for i in range(columns.count)] if columns.keys is not None else [None] * columns.count
    values = [columns.values.item(i) for i in range(columns.count)]
    headers = columns.headers
    members: dict[int, list[int]] = {}
    for index, key in enumerate(route if route is not None else keys):
        target = partition_for_key(key, partition_count) if key is not None else -1
        members.setdefault(target, []).append(index)
    out: list[tuple[int, Columns]] = []
    for target, indices in sorted(members.items()):
        out.append((target, Columns([values[i] for i in indices], [keys[i] for i in indices],
                                    [headers[i] for i in indices] if headers is not None else None)))
    return out


def check_fits(columns: Columns, topic: str, limit_bytes: int) -> None:
    """Refuse the whole call, before queueing anything, if one record cannot fit a batch."""
    largest = columns.largest_record_bytes(limit_bytes - BATCH_HEADER_BYTES)
    if largest + BATCH_HEADER_BYTES > limit_bytes:
        raise errors.MessageTooLargeError(
            f"a record of {largest} bytes does not fit topic {topic!r}'s message_bytes_max={limit_bytes} with the "
            f"{BATCH_HEADER_BYTES}-byte batch header", record_bytes=largest, limit_bytes=limit_bytes)

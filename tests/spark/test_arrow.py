"""The task-side Arrow conversion: fetched batches -> Arrow columns, checked against the
SDK's record-by-record decoder (no Spark session, no cluster; milliseconds)."""

from __future__ import annotations

import random
import struct
import zlib
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

from fabric.protocol import batch as batch_format
from spark_connector import _reader
from spark_connector._reader import FabricInputPartition, _ArrowBuilder, _Chunk, arrow_schema

pytestmark = pytest.mark.spark


def part(include_headers: bool) -> FabricInputPartition:
    return FabricInputPartition("t", 3, 0, 10**9, bootstrap="zk://h:1", node_addresses=(),
                                include_headers=include_headers, fail_on_data_loss=True, poll_timeout_ms=1000)


def make_batch(rng: random.Random, n: int, base_offset: int, *, codec: int, log_append: bool = False,
               headers: bool = True) -> tuple[bytes, list[tuple[Any, ...]]]:
    """A batch as the leader stores it, and its records as (offset, key, value, ms, headers)."""
    first_ts = 1_700_000_000_000 + rng.randrange(10**6)
    timestamps = [first_ts + rng.randrange(-5000, 5000) for _ in range(n)]
    timestamps[0] = first_ts
    keys = [None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 6)) for _ in range(n)]
    values = [None if rng.random() < 0.2 else rng.randbytes(rng.randrange(0, 40)) for _ in range(n)]
    hdrs: list[list[tuple[str, bytes | None]]] = [
        [(f"h{j}é", None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 5)))
         for j in range(rng.choice((0, 0, 1, 3)))] if headers else []
        for _ in range(n)
    ]
    buf = bytearray(batch_format.encode_batch(timestamps, keys, values, hdrs, codec=codec, base_offset=base_offset))
    if log_append:
        buf[21] |= batch_format.TIMESTAMP_LOG_APPEND
        struct.pack_into("<I", buf, 16, zlib.crc32(memoryview(buf)[20:]) & 0xFFFFFFFF)
    expected = [(base_offset + i, keys[i], values[i], timestamps[i], hdrs[i]) for i in range(n)]
    return bytes(buf), expected


def as_rows(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    d = batch.to_pydict()
    out = []
    for i in range(batch.num_rows):
        ms = int(d["timestamp"][i].timestamp() * 1000) if d["timestamp"][i] is not None else None
        hdrs = [(h["key"], h["value"]) for h in d["headers"][i]] if "headers" in d else []
        out.append((d["offset"][i], d["key"][i], d["value"][i], ms, hdrs))
    return out


@pytest.mark.parametrize("codec", [batch_format.CODEC_NONE, batch_format.CODEC_LZ4])
@pytest.mark.parametrize("include_headers", [False, True])
def test_chunks_match_the_record_decoder(codec: int, include_headers: bool) -> None:
    rng = random.Random(codec * 2 + include_headers)
    builder = _ArrowBuilder(part(include_headers), arrow_schema(include_headers))
    expected: list[tuple[Any, ...]] = []
    base = 100
    for n, skip, cut in ((7, 0, 0), (1, 0, 0), (50, 13, 0), (20, 0, 5), (30, 29, 0), (9, 2, 3)):
        buf, records = make_batch(rng, n, base, codec=codec)
        count = n - cut
        builder.add(_Chunk(batch_format.column_view(buf), skip, count))
        expected.extend(records[skip:count])
        base += n + 2  # a gap: offsets come from each batch, not a running counter
    batch = builder.build()
    assert batch.schema.equals(arrow_schema(include_headers))
    assert batch.column("topic").to_pylist() == ["t"] * len(expected)
    assert set(batch.column("partition").to_pylist()) == {3}
    assert set(batch.column("timestampType").to_pylist()) == {0}
    got = as_rows(batch)
    if not include_headers:
        expected = [(*r[:4], []) for r in expected]
    assert got == expected
    assert builder.rows == 0 and builder.chunks == []


def test_timestamp_type_follows_the_batch_attribute() -> None:
    rng = random.Random(7)
    builder = _ArrowBuilder(part(False), arrow_schema(False))
    create, _ = make_batch(rng, 3, 0, codec=batch_format.CODEC_LZ4, headers=False)
    append, _ = make_batch(rng, 2, 3, codec=batch_format.CODEC_LZ4, log_append=True, headers=False)
    builder.add(_Chunk(batch_format.column_view(append), 0, 2))
    assert builder.build().column("timestampType").to_pylist() == [1, 1]
    builder.add(_Chunk(batch_format.column_view(create), 1, 3))
    builder.add(_Chunk(batch_format.column_view(append), 0, 2))
    assert builder.build().column("timestampType").to_pylist() == [0, 0, 1, 1]


def test_all_null_keys_and_timestamps_in_utc() -> None:
    ts = int(datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=timezone.utc).timestamp() * 1000)
    buf = batch_format.encode_batch([ts, ts + 1], [None, None], [b"a", b""])
    builder = _ArrowBuilder(part(False), arrow_schema(False))
    builder.add(_Chunk(batch_format.column_view(buf), 0, 2))
    batch = builder.build()
    assert batch.column("key").to_pylist() == [None, None] and batch.column("key").null_count == 2
    assert batch.column("value").to_pylist() == [b"a", b""]
    assert batch.column("timestamp").to_pylist()[0] == datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=timezone.utc)


def test_batches_are_cut_by_rows_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = batch_format.encode_batch([0] * 10, [None] * 10, [b"x" * 100] * 10)
    builder = _ArrowBuilder(part(False), arrow_schema(False))
    monkeypatch.setattr(_reader, "ARROW_BATCH_BYTES", 2000)
    monkeypatch.setattr(_reader, "ARROW_BATCH_ROWS", 25)
    for expected_full in (False, True):
        builder.add(_Chunk(batch_format.column_view(buf), 0, 10))
        assert builder.full is expected_full  # 1000 then 2000 value bytes
    builder.build()
    monkeypatch.setattr(_reader, "ARROW_BATCH_BYTES", 10**9)
    for expected_full in (False, False, True):  # 10, 20, 30 rows
        builder.add(_Chunk(batch_format.column_view(buf), 0, 10))
        assert builder.full is expected_full


def test_corrupt_headers_are_refused() -> None:
    buf = bytearray(batch_format.encode_batch([0], [None], [b"v"], [[("name", b"value")]],
                                              codec=batch_format.CODEC_NONE))
    struct.pack_into("<i", buf, len(buf) - 5 - 4, 1000)  # the header value's length runs past the end
    struct.pack_into("<I", buf, 16, zlib.crc32(memoryview(buf)[20:]) & 0xFFFFFFFF)
    builder = _ArrowBuilder(part(True), arrow_schema(True))
    builder.add(_Chunk(batch_format.column_view(bytes(buf)), 0, 1))
    with pytest.raises(Exception, match="header value length"):
        builder.build()

"""send_batch's column path: the same wire bytes as the per-record encoder, no sockets."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from fabric import errors
from fabric.protocol import batch as batch_format
from sdk import bulk

TS = 1_700_000_000_000


def framed(piece: bulk.Piece, codec: int = batch_format.CODEC_NONE) -> bytes:
    return batch_format.frame_batch(batch_format.compress_records(piece.records, codec), piece.record_count, TS, TS,
                                    producer_id=7, producer_epoch=1, base_sequence=40, tag_bloom=piece.tag_bloom)


def reference(values: list[bytes | None], keys: list[bytes | None] | None = None,
              headers: list[list[tuple[str, bytes | None]] | None] | None = None,
              codec: int = batch_format.CODEC_NONE) -> bytes:
    from fabric.protocol import tags

    return batch_format.encode_batch([TS] * len(values), keys or [None] * len(values), values, headers, codec=codec,
                                     producer_id=7, producer_epoch=1, base_sequence=40,
                                     tag_bloom=tags.batch_bloom(headers))


@pytest.mark.parametrize("codec", [batch_format.CODEC_NONE, batch_format.CODEC_LZ4])
def test_columns_encode_the_bytes_send_would(codec: int) -> None:
    values: list[bytes | None] = [b"a" * 10, None, b"", b"xyz" * 50, b"tail"]
    keys: list[bytes | None] = [b"k1", None, b"k3", b"", b"k5"]
    headers = [[("h", b"1")], None, [("fabric.tags", b"paid"), ("n", None)], None, []]
    cols = bulk.Columns(values, keys, headers)
    [(start, end)] = cols.cut(0, cols.count, 1 << 20)
    assert framed(cols.piece(0, start, end), codec) == reference(values, keys, headers, codec)
    assert framed(bulk.Columns(values).piece(0, 0, 5), codec) == reference(values, None, None, codec)


def test_arrow_arrays_encode_like_lists_without_copying_records() -> None:
    values = [b"one", None, b"three" * 20, b"", b"five"]
    keys = ["a", "b", None, "d", "e"]
    want = reference(values, [None if k is None else k.encode() for k in keys])
    assert framed(bulk.Columns(pa.array(values, pa.binary()), pa.array(keys, pa.string())).piece(0, 0, 5)) == want
    chunked = pa.chunked_array([pa.array(values[:2], pa.large_binary()), pa.array(values[2:], pa.large_binary())])
    assert framed(bulk.Columns(chunked).piece(0, 0, 5)) == reference(values)
    sliced = pa.array([b"skip", *values], pa.binary()).slice(1)  # an array with an offset
    assert framed(bulk.Columns(sliced).piece(0, 1, 4)) == reference(values[1:4])


def test_cut_respects_batch_bytes_max_and_keeps_order() -> None:
    values = [bytes([i % 256]) * (i % 37) for i in range(1000)]
    cols = bulk.Columns(values)
    runs = cols.cut(0, cols.count, 500)
    assert runs[0][0] == 0 and runs[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))
    assert all(cols.size_bytes(s, e) <= 500 or e - s == 1 for s, e in runs)
    assert all(cols.size_bytes(s, e + 1) > 500 for s, e in runs[:-1])  # each run is as full as it can be
    big = bulk.Columns([b"x" * 900, b"y"])
    assert big.cut(0, 2, 500) == [(0, 1), (1, 2)]  # a record larger than the target gets its own batch


def test_bad_input_is_refused_before_anything_is_queued() -> None:
    with pytest.raises(TypeError):
        bulk.Columns(b"not a list")
    with pytest.raises(TypeError):
        bulk.Columns([b"a", 3])
    with pytest.raises(ValueError):
        bulk.Columns([b"a", b"b"], keys=[b"k"])
    with pytest.raises(TypeError):
        bulk.Columns(pa.array([1, 2, 3]))
    with pytest.raises(errors.MessageTooLargeError):
        bulk.check_fits(bulk.Columns([b"x" * 2000]), "t", 1000)
    bulk.check_fits(bulk.Columns([b"x" * 100]), "t", 1000)


def test_by_key_partitions_as_send_does() -> None:
    from fabric.protocol.keyhash import partition_for_key

    keys = [b"k%d" % i for i in range(50)]
    values = [b"v%d" % i for i in range(50)]
    groups = bulk.by_key(bulk.Columns(values, keys), 4)
    for partition, group in groups:
        got = [group.values.item(i) for i in range(group.count)]
        assert got == [v for k, v in zip(keys, values, strict=True) if partition_for_key(k, 4) == partition]


def test_null_keys_are_left_to_the_sticky_partitioner() -> None:
    # Not all to partition 0, as once: send(key=None) spreads them, so does send_batch.
    keys = [b"a", None, b"b", None]
    groups = dict(bulk.by_key(bulk.Columns([b"1", b"2", b"3", b"4"], keys), 4))
    sticky = groups[-1]
    assert [sticky.values.item(i) for i in range(sticky.count)] == [b"2", b"4"]

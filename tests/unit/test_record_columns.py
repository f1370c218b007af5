"""The compiled records-section check (fabric/protocol/_columns.pyx) and its pure twin give
the same answers, and ``check_records`` returns the batch's true largest timestamp."""

from __future__ import annotations

import random
import struct

import pytest

from fabric import errors
from fabric.protocol import batch as batch_format
from tests.unit.test_produce_validation import rewrite

try:
    from fabric.protocol import _columns
except ImportError:  # not built (scripts/install.sh builds it): the pure path is all there is
    _columns = None  # type: ignore[assignment]

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def section(rng: random.Random, n: int) -> bytes:
    """A records section's fixed-width columns, often invalid (odd lengths, extremes),
    followed by some bytes: both twins must read exactly the same numbers from it."""
    edge = [I32_MIN, I32_MIN + 1, -2, -1, 0, 1, I32_MAX - 1, I32_MAX]
    def i32() -> int:
        return rng.choice(edge) if rng.random() < 0.2 else rng.randint(-3, 5000)
    deltas = [i32() for _ in range(n)]
    lengths = [i32() for _ in range(2 * n)]
    counts = [rng.choice([0, 0, 0, 1, 65535]) if rng.random() < 0.3 else 0 for _ in range(n)]
    tail = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    return struct.pack(f"<{3 * n}i{n}H", *deltas, *lengths, *counts) + tail


@pytest.mark.skipif(_columns is None, reason="fabric/protocol/_columns.pyx is not built")
def test_the_twins_agree_on_random_sections() -> None:
    rng = random.Random(1)
    for _ in range(3000):
        n = rng.choice([1, 2, 3, rng.randint(1, 400)])
        records = section(rng, n)
        assert _columns.record_columns(records, n) == batch_format._record_columns_py(records, n), (n, records[:64])


@pytest.mark.skipif(_columns is None, reason="fabric/protocol/_columns.pyx is not built")
def test_the_compiled_twin_refuses_a_section_too_short() -> None:
    with pytest.raises(ValueError):
        _columns.record_columns(bytes(27), 2)


def test_check_records_returns_the_largest_record_timestamp() -> None:
    timestamps = [1_700_000_000_500, 1_700_000_000_000, 1_700_000_009_000, 1_700_000_000_001]
    buf = batch_format.encode_batch(timestamps, [None] * 4, [b"a", b"b", b"c", b"d"],
                                    headers=[[("h", b"v")], None, [], [("x", None)]], codec=batch_format.CODEC_NONE)
    header = batch_format.read_header(buf)
    assert batch_format.check_records(header, batch_format.records_section(buf, header)) == max(timestamps)
    # An understated claim does not change what the records say.
    lying = rewrite(buf, max_timestamp=timestamps[0])
    header = batch_format.read_header(lying)
    assert batch_format.check_records(header, batch_format.records_section(lying, header)) == max(timestamps)


def test_with_max_timestamp_writes_the_field_and_a_new_crc() -> None:
    buf = batch_format.encode_batch([1_700_000_000_000, 1_700_000_100_000], [None, None], [b"a", b"b"])
    lying = rewrite(buf, max_timestamp=1_700_000_000_000)
    fixed = batch_format.with_max_timestamp(lying, 1_700_000_100_000)
    assert bytes(fixed) == buf  # the producer's batch as it should have been, CRC included
    header = batch_format.validate(fixed, 1 << 20)
    assert header.max_timestamp == 1_700_000_100_000


def test_records_checks_still_refuse_bad_sections() -> None:
    buf = batch_format.encode_batch([1_700_000_000_000, 1_700_000_000_001], [None, None], [b"x", b"y"],
                                    codec=batch_format.CODEC_NONE)
    header = batch_format.read_header(buf)
    records = bytearray(batch_format.records_section(buf, header))
    struct.pack_into("<i", records, 8, -2)  # record 0's key length
    with pytest.raises(errors.CorruptMessageError, match="negative key or value length"):
        batch_format.check_records(header, bytes(records))
    struct.pack_into("<i", records, 8, 5)  # the lengths now need more bytes than there are
    with pytest.raises(errors.CorruptMessageError, match="add up to"):
        batch_format.check_records(header, bytes(records))
    with pytest.raises(errors.CorruptMessageError, match="after the last record"):
        batch_format.check_records(header, batch_format.records_section(buf, header) + b"!")

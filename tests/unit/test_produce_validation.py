"""What a node refuses in a producer's batch beyond the batch format, without I/O.

A fuzzing audit of PRODUCE found batches that were acknowledged and then lost or broke
readers: the control bit set by a producer (every consumer skips the batch), attribute
bits 6-7 set, record timestamps past the i64 (the SDK returned 9223372036854776807),
max_timestamp below first_timestamp, producer ids below -1, negative epochs and
sequences, and an idempotent producer stuck for good once its sequence passed 2^31 - 1.
It also found that one request of lz4 batches could make the node's loop decompress
gigabytes: PRODUCE_DECOMPRESSED_BYTES_MAX bounds that per request. The same refusals on a
live node: tests/integration/test_produce_validation.py.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from fabric import errors
from fabric.limits import (
    BATCH_UNCOMPRESSED_BYTES_MAX,
    I16_MAX,
    I32_MAX,
    I64_MAX,
    PRODUCE_DECOMPRESSED_BYTES_MAX,
)
from fabric.protocol import batch as batch_format
from fabric.protocol import tags as tags_format
from nodes.produce import charge_decompression
from nodes.producer_state import APPEND, DUPLICATE, ProducerStates
from sdk.producer import _ProducerCore
from tests.unit.test_producer_inputs import offline_core

MIB = 1024 * 1024


def rewrite(buf: bytes, **fields: int) -> bytes:
    """``buf`` with header fields replaced (by their byte offsets) and the CRC recomputed."""
    offsets = {"attributes": (21, "<B"), "first_timestamp": (28, "<q"), "max_timestamp": (36, "<q"),
               "producer_id": (44, "<q"), "producer_epoch": (52, "<h"), "base_sequence": (56, "<i"),
               "global_id_base": (60, "<q")}
    out = bytearray(buf)
    for name, value in fields.items():
        offset, fmt = offsets[name]
        struct.pack_into(fmt, out, offset, value)
    struct.pack_into("<I", out, 16, batch_format.compute_crc(out))
    return bytes(out)


def checked(buf: bytes) -> batch_format.BatchHeader:
    """What the node's PRODUCE path runs on a batch (nodes/produce.py ``stage``)."""
    header = batch_format.validate(buf, 1 << 26, contents=False)
    batch_format.check_produced(header)
    batch_format.check_records(header, batch_format.records_section(buf, header))
    return header


def plain(timestamps: list[int] | None = None, **kwargs: int) -> bytes:
    timestamps = timestamps or [1_700_000_000_000, 1_700_000_000_005]
    return batch_format.encode_batch(timestamps, [None] * len(timestamps), [b"v"] * len(timestamps), **kwargs)


# -- what producers make passes ----------------------------------------------------------------

def test_batches_the_sdk_and_the_nodes_make_pass() -> None:
    checked(plain())
    checked(plain(producer_id=0, producer_epoch=0, base_sequence=0))
    checked(plain(producer_id=I64_MAX, producer_epoch=I16_MAX, base_sequence=I32_MAX))  # wraps to 0
    checked(plain(codec=batch_format.CODEC_NONE))
    headers = [[(tags_format.TAGS_HEADER, b"paid")], None]
    checked(batch_format.encode_batch([1, 2], [None, None], [b"a", b"b"], headers, tag_bloom=tags_format.batch_bloom(headers)))
    # The log-append timestamp type (bit 3) is a producer's to set; nothing refuses it.
    checked(rewrite(plain(), attributes=batch_format.CODEC_LZ4 | batch_format.TIMESTAMP_LOG_APPEND))
    # Timestamps anywhere in the i64 whose records stay in it, with the widest deltas.
    lo, hi = batch_format.TIMESTAMP_MS_MIN, batch_format.TIMESTAMP_MS_MAX
    checked(plain([hi, hi - 5]))
    checked(plain([lo, lo + batch_format.TIMESTAMP_DELTA_MS_MAX]))
    checked(plain([0, batch_format.TIMESTAMP_DELTA_MS_MIN, batch_format.TIMESTAMP_DELTA_MS_MAX]))
    checked(plain([-5, -9]))  # before 1970: allowed


# -- C: the control bit and the reserved bits ----------------------------------------------------

def test_control_bit_from_a_producer_is_refused() -> None:
    control = rewrite(plain(), attributes=batch_format.CODEC_LZ4 | batch_format.ATTRIBUTE_CONTROL)
    batch_format.validate(control, 1 << 20)  # a well-formed batch: replication stores the leader's ticks
    with pytest.raises(errors.InvalidRequestError, match="leaders only"):
        checked(control)


@pytest.mark.parametrize("bits", [0x40, 0x80, 0xC0])
def test_reserved_attribute_bits_are_refused(bits: int) -> None:
    with pytest.raises(errors.CorruptMessageError, match="bits 6-7"):
        checked(rewrite(plain(), attributes=batch_format.CODEC_LZ4 | bits))


# -- D: timestamps ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("timestamps", "first_ts"), [
    ([0, 1000], I64_MAX),  # the audit's: record 1 at 2^63 - 1 + 1000
    ([0, -1000], -(2**63)),
    ([0, I32_MAX], I64_MAX - I32_MAX + 1),  # one past, at the edge of the window
])
def test_record_timestamps_past_the_i64_are_refused(timestamps: list[int], first_ts: int) -> None:
    # The deltas stay; first_timestamp moves to the edge (max_timestamp, an i64 that cannot
    # say the truth, claims record 0's: the header alone looks consistent).
    forged = rewrite(plain(timestamps), first_timestamp=first_ts, max_timestamp=first_ts)
    with pytest.raises(errors.CorruptMessageError, match="i64"):
        checked(forged)


@pytest.mark.parametrize(("first_ts", "max_ts"), [
    (1_700_000_000_000, 0),  # the audit's "lying" max_timestamp
    (1_700_000_000_000, 1_700_000_000_000 - 1),
    (0, batch_format.TIMESTAMP_DELTA_MS_MAX + 1),  # no record can be that far after record 0
])
def test_max_timestamp_outside_the_batch_window_is_refused(first_ts: int, max_ts: int) -> None:
    with pytest.raises(errors.CorruptMessageError, match="max_timestamp"):
        checked(rewrite(plain([0, 0]), first_timestamp=first_ts, max_timestamp=max_ts))


# -- E: producer id, epoch and sequence ranges -------------------------------------------------------

@pytest.mark.parametrize(("fields", "match"), [
    ({"producer_id": -2, "producer_epoch": 0, "base_sequence": 0}, "producer_id -2"),
    ({"producer_id": -(2**63), "producer_epoch": 0, "base_sequence": 0}, "producer_id"),
    ({"producer_id": 5, "producer_epoch": -5, "base_sequence": 0}, "producer_epoch -5"),
    ({"producer_id": 5, "producer_epoch": -1, "base_sequence": 0}, "producer_epoch -1"),
    ({"producer_id": 5, "producer_epoch": 0, "base_sequence": -7}, "base_sequence -7"),
    ({"producer_id": 5, "producer_epoch": 0, "base_sequence": -1}, "base_sequence -1"),
])
def test_producer_fields_out_of_range_are_refused(fields: dict[str, int], match: str) -> None:
    with pytest.raises(errors.CorruptMessageError, match=match):
        checked(rewrite(plain(), **fields))


def test_a_batch_without_idempotence_ignores_epoch_and_sequence() -> None:
    # producer_id -1: the other two fields mean nothing (the node never reads them).
    checked(rewrite(plain(), producer_id=-1, producer_epoch=3, base_sequence=9))


def test_sequences_wrap_from_i32_max_to_zero() -> None:
    s = ProducerStates()
    top = I32_MAX
    assert s.check(6, 0, top - 1, 1) == (APPEND, -1)
    s.record(6, 0, top - 1, 1, base_offset=0)
    assert s.check(6, 0, top, 2) == (APPEND, -1)  # the audit's: sequences 2^31 - 1 and 0
    s.record(6, 0, top, 2, base_offset=1)
    assert s.check(6, 0, 1, 3) == (APPEND, -1)  # not "sequence 1 after 2147483648"
    s.record(6, 0, 1, 3, base_offset=3)
    assert s.check(6, 0, top, 2) == (DUPLICATE, 1)  # a retry of the batch across the wrap
    assert s.check(6, 0, 1, 3) == (DUPLICATE, 3)
    assert s.check(6, 0, top - 1, 1) == (DUPLICATE, 0)
    assert s.check(6, 0, top - 100, 5) == (DUPLICATE, -1)  # older, before the wrap: never written twice
    with pytest.raises(errors.OutOfOrderSequenceError) as gap:
        s.check(6, 0, 9, 1)
    assert gap.value.expected_sequence == 4
    with pytest.raises(errors.OutOfOrderSequenceError) as overlap:
        s.check(6, 0, 2, 5)  # partly stored, partly new
    assert overlap.value.expected_sequence == 4
    assert s.check(6, 0, 4, 1) == (APPEND, -1)


def test_rebuilt_state_after_a_wrap_matches_the_live_one() -> None:
    # Rebuilding replays record() in log order: the last sequence is the newest, not the largest.
    s = ProducerStates()
    for base, count, offset in ((I32_MAX - 4, 5, 0), (0, 10, 5), (10, 1, 15)):
        s.record(9, 2, base, count, offset)
    assert s.producers[9].last_sequence == 10
    assert s.check(9, 2, 11, 1) == (APPEND, -1)
    assert s.check(9, 2, I32_MAX - 4, 5) == (DUPLICATE, 0)


@pytest.fixture
def core() -> Iterator[_ProducerCore]:
    yield from offline_core({"s": 1})


def test_the_python_producer_wraps_its_sequences_as_the_node_does(core: _ProducerCore) -> None:
    core._next_sequence[("s", 0)] = I32_MAX
    batches = []
    with core._lock:
        for value in (b"a", b"b"):
            core._acc.append("s", 0, 1_700_000_000_000, None, value, None, 0.0)
            core._acc.append("s", 0, 1_700_000_000_000, None, value, None, 0.0)
            batches.append(core._acc.batches[("s", 0)].popleft())
            del core._acc.open[("s", 0)]
    state = ProducerStates()
    state.record(7, 0, I32_MAX - 10, 10, base_offset=0)
    offset = 10
    for b in batches:
        header = checked(core._encode(b))
        assert state.check(7, 0, header.base_sequence, header.record_count) == (APPEND, -1)
        state.record(7, 0, header.base_sequence, header.record_count, offset)
        offset += header.record_count
    assert [b.base_sequence for b in batches] == [I32_MAX, 1]
    assert core._next_sequence[("s", 0)] == 3


# -- A: the decompression budget of one request ---------------------------------------------------

def test_decompression_budget_takes_the_first_batch_and_refuses_past_the_limit() -> None:
    big = BATCH_UNCOMPRESSED_BYTES_MAX
    assert charge_decompression(0, big) == big  # the first compressed batch, whatever its size
    spent = 0
    taken = 0
    while True:
        try:
            spent = charge_decompression(spent, 60 * MIB)
        except errors.ThrottledError as exc:
            assert exc.retriable and "PRODUCE_DECOMPRESSED_BYTES_MAX" in exc.message
            break
        taken += 1
    assert taken == PRODUCE_DECOMPRESSED_BYTES_MAX // (60 * MIB) and spent <= PRODUCE_DECOMPRESSED_BYTES_MAX
    assert charge_decompression(PRODUCE_DECOMPRESSED_BYTES_MAX - 1, 1) == PRODUCE_DECOMPRESSED_BYTES_MAX

"""The record-batch format: an uncompressed 72-byte header, then the records section.

Header layout (little-endian)::

    offset size field            notes
    0      8    base_offset      i64  stamped by the leader; producers send 0
    8      4    batch_length     i32  bytes of the whole batch, header included
    12     4    leader_epoch     i32  stamped by the leader; producers send -1
    16     4    crc              u32  CRC-32 (zlib/IEEE, poly 0xEDB88320) of bytes [20, batch_length)
    20     1    magic            u8   1
    21     1    attributes       u8   bits 0-2 codec (0 none, 1 lz4); bit 3 timestamp type;
                                      bit 4 control batch; bit 5 tag bloom present
    22     2    tag_bloom_low    u16  with bit 5: low half of the tag bloom (tags.py), else 0
    24     4    record_count     i32  >= 1
    28     8    first_timestamp  i64  ms since the epoch, of record 0
    36     8    max_timestamp    i64  ms, the largest record timestamp
    44     8    producer_id      i64  -1 when not idempotent
    52     2    producer_epoch   i16  -1 when not idempotent
    54     2    tag_bloom_high   u16  with bit 5: high half of the tag bloom, else 0
    56     4    base_sequence    i32  -1 when not idempotent
    60     8    global_id_base   i64  sequencer ID of record 0 on strict-order topics, else -1
    68     4    records_bytes    i32  size of the records section before compression

The CRC starts at byte 20 so that the leader can stamp base_offset and leader_epoch
without recomputing it, and without decompressing or re-encoding anything: consumers
receive the producer's bytes (the same reason Kafka's v2 format keeps those fields first).

Records section, columnar so that encoders and decoders work per batch, not per field::

    timestamp_delta  record_count x i32   ms after first_timestamp
    key_length       record_count x i32   -1 = null key
    value_length     record_count x i32   -1 = null value
    header_count     record_count x u16
    keys             the non-null keys, concatenated in record order
    values           the non-null values, concatenated in record order
    headers          per record, per header: u16 name length, UTF-8 name,
                     i32 value length (-1 = null), value bytes

With codec lz4 the records section is one lz4 frame (the standard LZ4 frame format, with
its content-size field set to records_bytes). A decoder never trusts the frame's claim:
it checks it against records_bytes and BATCH_UNCOMPRESSED_BYTES_MAX first, and
decompresses with an output bound.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable, Sequence
from itertools import accumulate, pairwise
from typing import NamedTuple

import lz4.frame

try:
    # The same CRC-32 as zlib's, computed with the CPU's carry-less multiply: about 16x
    # zlib's speed on a 256 KiB batch (3.5 against 58 us here). A producer, every replica
    # and a checking consumer each run it over every batch byte; in a node storing random
    # values zlib's loop was 9 % of its CPU. Same results, so zlib remains the fallback.
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a dependency; a machine without its wheel
    from zlib import crc32 as _crc32

from fabric.errors import (
    CorruptMessageError,
    DecompressionLimitError,
    InvalidRequestError,
    MessageTooLargeError,
    UnsupportedCompressionError,
)
from fabric.limits import (
    BATCH_HEADER_BYTES,
    BATCH_RECORDS_MAX,
    BATCH_UNCOMPRESSED_BYTES_MAX,
    I16_MAX,
    I32_MAX,
)

BATCH_MAGIC = 1
CODEC_NONE = 0
CODEC_LZ4 = 1
CODEC_MASK = 0x07
TIMESTAMP_LOG_APPEND = 0x08
# A control batch (a strict-order tick): counted in offsets, skipped by every consumer.
ATTRIBUTE_CONTROL = 0x10
TAG_BLOOM_PRESENT = 0x20  # bytes 22-23 (low half) and 54-55 (high half) hold the batch's tag bloom
ATTRIBUTES_RESERVED = 0xC0  # bits 6-7: no meaning yet, so 0 in every batch a producer sends
CODECS = {"none": CODEC_NONE, "lz4": CODEC_LZ4}
RECORD_FIXED_BYTES = 14  # 3 x i32 + 1 x u16 per record in the columnar arrays
# What the records section's fields can hold: a record's timestamp is an i32 delta from
# the batch's first_timestamp (about 24.8 days either way), its header count a u16, a
# header name's length a u16. A producer keeps records that do not fit one batch's window
# in separate batches, and refuses the rest before they are queued.
TIMESTAMP_MS_MIN = -(1 << 63)
TIMESTAMP_MS_MAX = (1 << 63) - 1
TIMESTAMP_DELTA_MS_MIN = -(1 << 31)
TIMESTAMP_DELTA_MS_MAX = (1 << 31) - 1
# Offsets are i64 on the wire; a batch's records must all have one (and the offset after
# it, where a reader's position moves, too).
OFFSET_MAX = (1 << 63) - 1
NO_PRODUCER_ID = -1  # producer_id of a batch that is not idempotent (its epoch and sequence are ignored)
HEADERS_PER_RECORD_MAX = 0xFFFF
HEADER_NAME_BYTES_MAX = 0xFFFF
CRC_START = 20
LZ4_EXPANSION_MAX = 256  # output bytes per compressed byte lz4 can reach, rounded up

_HEADER = struct.Struct("<qiiIBBHiqqqhhiqi")
_STAMP = struct.Struct("<q")
_EPOCH = struct.Struct("<i")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
assert _HEADER.size == BATCH_HEADER_BYTES


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    leader_epoch: int
    crc: int
    magic: int
    attributes: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    global_id_base: int
    records_bytes: int

    @property
    def codec(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


Header = tuple[str, bytes | None]


class ColumnView(NamedTuple):
    """A batch's columns without building a Python object per record: the lengths as
    tuples and the byte regions as offsets into ``records`` (for Arrow and other
    columnar consumers, which can slice buffers directly)."""

    header: BatchHeader
    records: bytes  # the uncompressed records section
    timestamp_deltas: tuple[int, ...]
    key_lengths: tuple[int, ...]
    value_lengths: tuple[int, ...]
    header_counts: tuple[int, ...]
    keys_start: int  # where the concatenated keys begin in ``records``
    values_start: int
    headers_start: int


class DecodedBatch(NamedTuple):
    header: BatchHeader
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[Header]]


def read_header(buf: bytes | bytearray | memoryview) -> BatchHeader:
    """Parse the fixed header only. Raises CorruptMessageError if it cannot be a batch."""
    if len(buf) < BATCH_HEADER_BYTES:
        raise CorruptMessageError(f"batch of {len(buf)} bytes is shorter than its {BATCH_HEADER_BYTES}-byte header")
    f = _HEADER.unpack_from(buf, 0)
    # f: base, length, epoch, crc, magic, attrs, reserved, count, first_ts, max_ts,
    #    pid, pepoch, reserved2, base_seq, global_id_base, records_bytes
    return BatchHeader(f[0], f[1], f[2], f[3], f[4], f[5], f[7], f[8], f[9], f[10], f[11], f[13], f[14], f[15])


def tag_bloom(buf: bytes | bytearray | memoryview) -> int | None:
    """The batch's 32-bit tag bloom, or None if the producer wrote none (attribute bit 4)."""
    if len(buf) < BATCH_HEADER_BYTES or not buf[21] & TAG_BLOOM_PRESENT:
        return None
    low, high = _U16.unpack_from(buf, 22)[0], _U16.unpack_from(buf, 54)[0]
    return int(low | (high << 16))


def compute_crc(buf: bytes | bytearray | memoryview) -> int:
    return _crc32(memoryview(buf)[CRC_START:]) & 0xFFFFFFFF


def validate(buf: bytes | bytearray | memoryview, message_bytes_max: int, *, contents: bool = True) -> BatchHeader:
    """Everything a node checks before it appends a batch.

    Checks the size limit first (cheapest, and it bounds the CRC work), then the header's
    self-consistency, then the CRC, then the lz4 frame's own size claim, and last (with
    ``contents``, the default) that the records section decodes: a batch with a valid CRC
    but junk inside would otherwise be acknowledged, stored and then refused by every
    reader of the partition. ``contents=False`` is for bytes a leader already checked.
    A producer's batch also goes through ``check_produced`` (nodes/produce.py).
    """
    if len(buf) > message_bytes_max:
        raise MessageTooLargeError(
            f"batch of {len(buf)} bytes exceeds the topic's message_bytes_max={message_bytes_max}",
            batch_bytes=len(buf),
            limit_bytes=message_bytes_max,
        )
    header = read_header(buf)
    if header.magic != BATCH_MAGIC:
        raise CorruptMessageError(f"batch magic {header.magic}, expected {BATCH_MAGIC}")
    if header.batch_length != len(buf):
        raise CorruptMessageError(f"batch_length says {header.batch_length} bytes, frame has {len(buf)}")
    if not 1 <= header.record_count <= BATCH_RECORDS_MAX:
        raise CorruptMessageError(f"record_count {header.record_count} outside [1, {BATCH_RECORDS_MAX}]")
    if header.records_bytes > BATCH_UNCOMPRESSED_BYTES_MAX:
        raise DecompressionLimitError(
            f"records_bytes {header.records_bytes} exceeds BATCH_UNCOMPRESSED_BYTES_MAX={BATCH_UNCOMPRESSED_BYTES_MAX}"
        )
    if header.records_bytes < RECORD_FIXED_BYTES * header.record_count:
        raise CorruptMessageError(
            f"records_bytes {header.records_bytes} too small for {header.record_count} records"
        )
    crc = compute_crc(buf)
    if crc != header.crc:
        raise CorruptMessageError(f"batch CRC 0x{crc:08x} does not match header 0x{header.crc:08x}")
    codec = header.codec
    payload_bytes = len(buf) - BATCH_HEADER_BYTES
    if codec == CODEC_NONE:
        if payload_bytes != header.records_bytes:
            raise CorruptMessageError(
                f"uncompressed batch carries {payload_bytes} record bytes, header says {header.records_bytes}"
            )
    elif codec == CODEC_LZ4:
        _check_lz4_claim(memoryview(buf)[BATCH_HEADER_BYTES:], header.records_bytes)
    else:
        raise UnsupportedCompressionError(f"compression codec {codec} is not supported (0 none, 1 lz4)")
    if contents:
        check_records(header, records_section(buf, header))
    return header


def check_produced(header: BatchHeader) -> None:
    """What a producer's batch must hold beyond ``validate``, from its header alone (O(1);
    the node's PRODUCE path calls it, not replication, which stores a leader's bytes).

    * No control bit (attribute bit 4): control batches are strict-order ticks, which a
      leader appends itself. A producer's would be acknowledged and then skipped by every
      consumer, its records lost. No reserved bit (6-7) either.
    * ``first_timestamp <= max_timestamp <= first_timestamp + TIMESTAMP_DELTA_MS_MAX``:
      record 0's timestamp is ``first_timestamp``, and no record's can pass the largest
      i32 delta. (``check_records`` checks that the records' timestamps fit an i64.)
    * ``producer_id`` -1 (not idempotent), or in [0, 2^63 - 1] with ``producer_epoch`` in
      [0, I16_MAX] and ``base_sequence`` in [0, I32_MAX] (sequences wrap from I32_MAX to 0,
      nodes/producer_state.py).
    """
    attributes = header.attributes
    if attributes & ATTRIBUTE_CONTROL:
        raise InvalidRequestError("control batches (attribute bit 4) are written by partition leaders only")
    if attributes & ATTRIBUTES_RESERVED:
        raise CorruptMessageError(f"batch attributes 0x{attributes:02x} set bits 6-7, which must be 0")
    first_ts, max_ts = header.first_timestamp, header.max_timestamp
    if not first_ts <= max_ts <= first_ts + TIMESTAMP_DELTA_MS_MAX:
        raise CorruptMessageError(
            f"max_timestamp {max_ts} outside [first_timestamp, first_timestamp + {TIMESTAMP_DELTA_MS_MAX}] "
            f"(first_timestamp {first_ts})")
    producer_id = header.producer_id
    if producer_id == NO_PRODUCER_ID:
        return
    if producer_id < 0:
        raise CorruptMessageError(f"producer_id {producer_id}: -1 (not idempotent) or 0 to 2^63-1")
    if not 0 <= header.producer_epoch <= I16_MAX:
        raise CorruptMessageError(
            f"producer {producer_id}: producer_epoch {header.producer_epoch} outside [0, {I16_MAX}]")
    if header.base_sequence < 0:
        raise CorruptMessageError(
            f"producer {producer_id}: base_sequence {header.base_sequence} outside [0, {I32_MAX}]")


def check_records(header: BatchHeader, records: bytes) -> int:
    """Check that an uncompressed records section holds exactly ``record_count`` records,
    and return the largest record timestamp (``first_timestamp`` + the largest delta).

    The columns' lengths must add up to the section's size, every header must parse, and
    nothing may follow the last header, so that whatever passes here decodes later. The
    fixed-width columns take one pass (``_record_columns``, compiled when built); only
    headers take a Python loop (per header, not per record, and only for records that have
    headers). A leader writes the returned timestamp into the batch's ``max_timestamp``
    when the producer's differs (nodes/produce.py), as Kafka's broker does: time look-ups
    and time retention trust that field.
    """
    n = header.record_count
    arrays_bytes = RECORD_FIXED_BYTES * n
    if len(records) < arrays_bytes:
        raise CorruptMessageError(f"records section of {len(records)} bytes too short for {n} records")
    low_delta, high_delta, shortest, lengths_total, has_headers = _record_columns(records, n)
    first_ts = header.first_timestamp
    low, high = first_ts + low_delta, first_ts + high_delta
    if low < TIMESTAMP_MS_MIN or high > TIMESTAMP_MS_MAX:
        # Only within an i32 of an end of the i64 (no real clock): readers could not
        # represent such a record's timestamp.
        raise CorruptMessageError(
            f"record timestamps {low} to {high} (first_timestamp {first_ts} plus the deltas) "
            f"outside the i64 range [{TIMESTAMP_MS_MIN}, {TIMESTAMP_MS_MAX}]")
    if shortest < -1:
        raise CorruptMessageError("negative key or value length")
    headers_start = arrays_bytes + lengths_total
    if headers_start > len(records):
        raise CorruptMessageError(
            f"key and value lengths add up to {lengths_total} bytes, "
            f"the records section has {len(records) - arrays_bytes} after its length arrays"
        )
    if has_headers:
        end = _decode_headers(records, headers_start, struct.unpack_from(f"<{n}H", records, 12 * n))[1]
    else:
        end = headers_start
    if end != len(records):
        raise CorruptMessageError(f"records section has {len(records) - end} bytes after the last record")
    return high


def _record_columns_py(records: bytes, n: int) -> tuple[int, int, int, int, bool]:
    """(smallest timestamp delta, largest delta, smallest key/value length, sum of the
    non-negative key/value lengths, whether any record has headers) of a records section's
    fixed-width columns; the caller checked that it holds ``14 * n`` bytes. What
    ``fabric/protocol/_columns.pyx`` computes without a Python object per record."""
    columns = struct.unpack_from(f"<{3 * n}i", records, 0)
    deltas, lengths = columns[:n], columns[n:]
    total = sum(lengths) + lengths.count(-1)  # the real lengths' sum while none is below -1
    shortest = min(lengths)
    if shortest < -1:
        total = sum(length for length in lengths if length > 0)
    counts = records[12 * n : 14 * n]
    return min(deltas), max(deltas), shortest, total, counts.count(0) != len(counts)


def _load_record_columns() -> Callable[[bytes, int], tuple[int, int, int, int, bool]]:
    """The compiled ``record_columns`` (fabric/protocol/_columns.pyx, built by
    scripts/install.sh), or the pure one: not built, ``FABRIC_PURE_PYTHON=1``, or a
    big-endian machine (the twin reads native integers). Same results either way."""
    if os.environ.get("FABRIC_PURE_PYTHON", "") == "1" or sys.byteorder != "little":
        return _record_columns_py
    try:
        from fabric.protocol import _columns
    except ImportError:
        return _record_columns_py
    compiled: Callable[[bytes, int], tuple[int, int, int, int, bool]] = _columns.record_columns
    return compiled


_record_columns = _load_record_columns()


def _check_lz4_claim(payload: memoryview, records_bytes: int) -> None:
    try:
        info = lz4.frame.get_frame_info(bytes(payload[:19]))
    except (RuntimeError, ValueError) as exc:
        raise CorruptMessageError(f"records section is not a valid lz4 frame: {exc}") from exc
    claimed = int(info.get("content_size") or 0)
    # LZ4 cannot expand more than ~255x (one match byte adds at most 255 output bytes),
    # and the decompressor allocates its whole output bound up front: without this check
    # a 100-byte batch claiming 64 MiB makes the node allocate 64 MiB (found by fuzzing).
    if claimed > LZ4_EXPANSION_MAX * len(payload):
        raise DecompressionLimitError(
            f"lz4 frame of {len(payload)} bytes claims {claimed} bytes of content, more than lz4 can expand to"
        )
    if claimed != records_bytes:
        raise DecompressionLimitError(
            f"lz4 frame claims {claimed} bytes of content, batch header says records_bytes={records_bytes}"
        )


def stamped(data: bytes | bytearray | memoryview, base_offset: int, leader_epoch: int) -> bytes:
    """The batch with the leader's base offset and epoch written in (CRC unaffected), as
    new bytes made in one copy: what the node stores and publishes. (A bytearray stamped
    in place and then turned into bytes copies every record twice.)"""
    view = memoryview(data)
    return b"".join((_STAMP.pack(base_offset), view[8:12], _EPOCH.pack(leader_epoch), view[16:]))


def with_max_timestamp(data: bytes | bytearray | memoryview, max_timestamp: int) -> bytearray:
    """A copy of the batch with ``max_timestamp`` written in and the CRC, which covers it,
    recomputed (a leader storing a producer's batch whose claim was wrong)."""
    buf = bytearray(data)
    _STAMP.pack_into(buf, 36, max_timestamp)
    struct.pack_into("<I", buf, 16, compute_crc(buf))
    return buf


def stamp_global_id(buf: bytearray, global_id_base: int) -> None:
    """Write a strict-order batch's first global ID in place and recompute the CRC, which
    covers ``global_id_base`` (the leader stamps it; docs/DESIGN.md, "Strict-order topics")."""
    _STAMP.pack_into(buf, 60, global_id_base)
    struct.pack_into("<I", buf, 16, compute_crc(buf))


def encode_batch(
    timestamps: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[Sequence[Header] | None] | None = None,
    *,
    codec: int = CODEC_LZ4,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    global_id_base: int = -1,
    base_offset: int = 0,
    leader_epoch: int = -1,
    lz4_level: int = 0,
    tag_bloom: int | None = None,
    adaptive: bool = False,
) -> bytes:
    """Encode one batch. All per-record work is list comprehensions and one struct.pack.
    ``adaptive``: send incompressible records uncompressed (``compress_records``)."""
    n = len(values)
    if n == 0 or n > BATCH_RECORDS_MAX:
        raise ValueError(f"a batch holds 1 to {BATCH_RECORDS_MAX} records, got {n}")
    if len(keys) != n or len(timestamps) != n:
        raise ValueError("timestamps, keys and values must have the same length")
    first_ts = timestamps[0]
    max_ts = max(timestamps)
    key_lengths = [-1 if k is None else len(k) for k in keys]
    value_lengths = [-1 if v is None else len(v) for v in values]
    if headers is None or not any(headers):
        header_counts = [0] * n
        header_bytes = b""
    else:
        header_counts = [len(h) if h else 0 for h in headers]
        header_bytes = encode_headers(headers)
    arrays = struct.pack(
        f"<{n}i{n}i{n}i{n}H",
        *[t - first_ts for t in timestamps],
        *key_lengths,
        *value_lengths,
        *header_counts,
    )
    records = b"".join(
        (
            arrays,
            b"".join([k for k in keys if k is not None]),
            b"".join([v for v in values if v is not None]),
            header_bytes,
        )
    )
    return frame_batch(
        compress_records(records, codec, lz4_level, adaptive=adaptive), n, first_ts, max_ts,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
        global_id_base=global_id_base, base_offset=base_offset, leader_epoch=leader_epoch, tag_bloom=tag_bloom,
    )


class Payload(NamedTuple):
    """A batch's records section after compression: everything but the header, which the
    producer adds when it knows the sequence numbers (``frame_batch``)."""

    data: bytes
    codec: int
    records_bytes: int  # uncompressed length, as the header's records_bytes field


INCOMPRESSIBLE_PROBE_BYTES = 4096  # adaptive: lz4 tries this much of the values first
INCOMPRESSIBLE_RATIO = 0.9  # ...and the batch goes uncompressed if the probe kept more than this


def compress_records(records: bytes, codec: int, lz4_level: int = 0, *, adaptive: bool = False) -> Payload:
    """Compress a records section with ``codec``.

    ``adaptive`` (what the producers do): records that do not compress (random, encrypted
    or already compressed values) are sent uncompressed, with codec none in the header, so
    that nobody spends time on lz4 for nothing: a 4 KiB probe from the middle of the
    section (the values) decides first, and a batch lz4 did not shrink is sent as it was."""
    if len(records) > BATCH_UNCOMPRESSED_BYTES_MAX:
        raise MessageTooLargeError(
            f"records section of {len(records)} bytes exceeds BATCH_UNCOMPRESSED_BYTES_MAX={BATCH_UNCOMPRESSED_BYTES_MAX}"
        )
    if codec == CODEC_LZ4:
        size = len(records)
        if adaptive and size >= 4 * INCOMPRESSIBLE_PROBE_BYTES:
            middle = size // 2
            probe = records[middle : middle + INCOMPRESSIBLE_PROBE_BYTES]
            if len(lz4.frame.compress(probe, compression_level=lz4_level)) > INCOMPRESSIBLE_RATIO * len(probe):
                return Payload(records, CODEC_NONE, size)
        compressed = lz4.frame.compress(records, compression_level=lz4_level, store_size=True, content_checksum=False)
        if adaptive and len(compressed) >= size:
            return Payload(records, CODEC_NONE, size)
        return Payload(compressed, CODEC_LZ4, size)
    if codec == CODEC_NONE:
        return Payload(records, CODEC_NONE, len(records))
    raise UnsupportedCompressionError(f"compression codec {codec} is not supported")


def encode_columns(
    record_count: int,
    key_lengths: bytes,
    keys_blob: bytes | memoryview,
    value_lengths: bytes,
    values_blob: bytes | memoryview,
    header_counts: bytes | None = None,
    header_bytes: bytes = b"",
) -> bytes:
    """The records section from ready-made columns, for records sharing one timestamp
    (``Producer.send_batch``): ``key_lengths``/``value_lengths`` are ``record_count``
    little-endian i32 (-1 = null), the blobs the non-null keys and values end to end,
    ``header_counts`` ``record_count`` u16 (None = no headers). No per-record Python work."""
    n = record_count
    if len(key_lengths) != 4 * n or len(value_lengths) != 4 * n or (header_counts is not None and len(header_counts) != 2 * n):
        raise ValueError("every column must hold record_count entries")
    return b"".join((bytes(4 * n), key_lengths, value_lengths, header_counts or bytes(2 * n),
                     keys_blob, values_blob, header_bytes))


def frame_batch(
    payload: Payload,
    record_count: int,
    first_ts: int,
    max_ts: int,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    global_id_base: int = -1,
    base_offset: int = 0,
    leader_epoch: int = -1,
    tag_bloom: int | None = None,
) -> bytes:
    """Header (with its CRC) + payload: one batch's bytes."""
    n = record_count
    if n == 0 or n > BATCH_RECORDS_MAX:
        raise ValueError(f"a batch holds 1 to {BATCH_RECORDS_MAX} records, got {n}")
    length = BATCH_HEADER_BYTES + len(payload.data)
    attributes, bloom_low, bloom_high = payload.codec, 0, 0
    if tag_bloom is not None:
        # The tag bloom (fabric/protocol/tags.py) in the two reserved fields, inside the CRC.
        attributes |= TAG_BLOOM_PRESENT
        bloom_low, bloom_high = tag_bloom & 0xFFFF, (tag_bloom >> 16) & 0xFFFF
    head = bytearray(
        _HEADER.pack(
            base_offset, length, leader_epoch, 0, BATCH_MAGIC, attributes, bloom_low, n, first_ts, max_ts,
            producer_id, producer_epoch, bloom_high - 0x10000 if bloom_high >= 0x8000 else bloom_high,
            base_sequence, global_id_base, payload.records_bytes,
        )
    )
    crc = _crc32(payload.data, _crc32(memoryview(head)[CRC_START:])) & 0xFFFFFFFF
    struct.pack_into("<I", head, 16, crc)
    return b"".join((head, payload.data))


def encode_headers(headers: Sequence[Sequence[Header] | None]) -> bytes:
    out: list[bytes] = []
    for record_headers in headers:
        if not record_headers:
            continue
        for name, value in record_headers:
            raw = name.encode("utf-8")
            out.append(_U16.pack(len(raw)))
            out.append(raw)
            if value is None:
                out.append(_I32.pack(-1))
            else:
                out.append(_I32.pack(len(value)))
                out.append(value)
    return b"".join(out)


def records_section(buf: bytes | bytearray | memoryview, header: BatchHeader) -> bytes:
    """The uncompressed records section, decompressed with a bound (never what lz4 claims)."""
    payload = memoryview(buf)[BATCH_HEADER_BYTES : header.batch_length]
    if header.codec == CODEC_NONE:
        return bytes(payload)
    if header.codec != CODEC_LZ4:
        raise UnsupportedCompressionError(f"compression codec {header.codec} is not supported")
    if header.records_bytes > BATCH_UNCOMPRESSED_BYTES_MAX:
        raise DecompressionLimitError(f"records_bytes {header.records_bytes} above the limit")
    _check_lz4_claim(payload, header.records_bytes)
    decompressor = lz4.frame.LZ4FrameDecompressor()
    try:
        records = decompressor.decompress(payload, max_length=header.records_bytes)  # no copy of the input
    except RuntimeError as exc:
        raise CorruptMessageError(f"lz4 frame does not decompress: {exc}") from exc
    if decompressor.unused_data:
        raise CorruptMessageError(f"{len(decompressor.unused_data)} bytes after the end of the lz4 frame")
    if len(records) != header.records_bytes:
        raise CorruptMessageError(
            f"lz4 frame decompressed to {len(records)} bytes, header says records_bytes={header.records_bytes}")
    if not decompressor.eof:
        raise CorruptMessageError("lz4 frame is cut short: its end mark is missing")
    return bytes(records)


def _checked_records(buf: bytes | bytearray | memoryview, check_crc: bool) -> tuple[BatchHeader, bytes]:
    """Header checks, the CRC, then the bounded decompression: what every reader does first."""
    header = read_header(buf)
    if header.magic != BATCH_MAGIC:
        raise CorruptMessageError(f"batch magic {header.magic}, expected {BATCH_MAGIC}")
    if header.batch_length > len(buf) or header.batch_length < BATCH_HEADER_BYTES:
        raise CorruptMessageError(f"batch_length {header.batch_length} does not fit a {len(buf)}-byte buffer")
    n = header.record_count
    if not 1 <= n <= BATCH_RECORDS_MAX:
        raise CorruptMessageError(f"record_count {n} outside [1, {BATCH_RECORDS_MAX}]")
    if check_crc and compute_crc(memoryview(buf)[: header.batch_length]) != header.crc:
        raise CorruptMessageError(f"batch at offset {header.base_offset}: CRC mismatch")
    return header, records_section(buf, header)


def record_headers(header: BatchHeader, records: bytes) -> list[list[Header]]:
    """Each record's headers, from a records section already decompressed and checked."""
    return _decode_records(header, records).headers


def decode_batch(buf: bytes | bytearray | memoryview, *, check_crc: bool = True) -> DecodedBatch:
    """Decode a whole batch into columns. Raises CorruptMessageError on any inconsistency."""
    return _decode_records(*_checked_records(buf, check_crc))


def column_view(buf: bytes | bytearray | memoryview, *, check_crc: bool = True) -> ColumnView:
    """Check and decompress a batch, then locate its columns; no per-record objects."""
    header, records = _checked_records(buf, check_crc)
    n = header.record_count
    arrays_bytes = RECORD_FIXED_BYTES * n
    if len(records) < arrays_bytes:
        raise CorruptMessageError(f"records section of {len(records)} bytes too short for {n} records")
    arrays = struct.unpack_from(f"<{n}i{n}i{n}i{n}H", records, 0)
    _check_timestamps(header.first_timestamp, arrays[0:n])
    key_lengths, value_lengths = arrays[n : 2 * n], arrays[2 * n : 3 * n]
    if min(key_lengths) < -1 or min(value_lengths) < -1:
        raise CorruptMessageError("negative key or value length")
    keys_start = arrays_bytes
    # Lengths are >= -1 here, so adding back one per null gives the sum of real lengths
    # with C-speed builtins instead of a generator over every record.
    values_start = keys_start + sum(key_lengths) + key_lengths.count(-1)
    headers_start = values_start + sum(value_lengths) + value_lengths.count(-1)
    if headers_start > len(records):
        raise CorruptMessageError("key and value lengths run past the records section")
    return ColumnView(header, records, arrays[0:n], key_lengths, value_lengths, arrays[3 * n :],
                      keys_start, values_start, headers_start)


def _check_timestamps(first: int, deltas: Sequence[int]) -> None:
    """Every record's timestamp is an i64. A leader refuses other records
    (``check_records``); a reader refuses them too, as the C client does, rather than hand
    out a timestamp no i64 holds. Only a first_timestamp within a delta of the i64 ends can
    fail, so the usual batch costs two comparisons."""
    if TIMESTAMP_MS_MIN - TIMESTAMP_DELTA_MS_MIN <= first <= TIMESTAMP_MS_MAX - TIMESTAMP_DELTA_MS_MAX:
        return
    low, high = first + min(deltas), first + max(deltas)
    if low < TIMESTAMP_MS_MIN or high > TIMESTAMP_MS_MAX:
        raise CorruptMessageError(f"record timestamps {low} to {high} outside the i64 range")


def _decode_records(header: BatchHeader, records: bytes) -> DecodedBatch:
    n = header.record_count
    arrays_bytes = RECORD_FIXED_BYTES * n
    if len(records) < arrays_bytes:
        raise CorruptMessageError(f"records section of {len(records)} bytes too short for {n} records")
    arrays = struct.unpack_from(f"<{n}i{n}i{n}i{n}H", records, 0)
    first = header.first_timestamp
    _check_timestamps(first, arrays[0:n])
    timestamps = [first + d for d in arrays[0:n]]
    key_lengths = arrays[n : 2 * n]
    value_lengths = arrays[2 * n : 3 * n]
    header_counts = arrays[3 * n : 4 * n]
    pos = arrays_bytes
    keys, pos = _slice_column(records, pos, key_lengths, "key")
    values, pos = _slice_column(records, pos, value_lengths, "value")
    if any(header_counts):
        headers, pos = _decode_headers(records, pos, header_counts)
    else:
        headers = [[] for _ in range(n)] if n <= 1 else _shared_empty_headers(n)
    if pos != len(records):
        raise CorruptMessageError(f"records section has {len(records) - pos} trailing bytes")
    return DecodedBatch(header, timestamps, keys, values, headers)


def _shared_empty_headers(n: int) -> list[list[Header]]:
    # Records without headers share one empty list; callers must not mutate it.
    empty: list[Header] = []
    return [empty] * n


def _slice_column(
    records: bytes, pos: int, lengths: tuple[int, ...], what: str
) -> tuple[list[bytes | None], int]:
    n = len(lengths)
    nulls = lengths.count(-1)
    if nulls == n:
        return [None] * n, pos
    if nulls == 0:
        if min(lengths) < 0:
            raise CorruptMessageError(f"negative {what} length")
        ends = list(accumulate(lengths, initial=pos))
        end = ends[-1]
        if end > len(records):
            raise CorruptMessageError(f"{what} lengths run past the records section")
        return [records[s:e] for s, e in pairwise(ends)], end
    out: list[bytes | None] = []
    for length in lengths:
        if length == -1:
            out.append(None)
            continue
        if length < 0 or pos + length > len(records):
            raise CorruptMessageError(f"bad {what} length {length}")
        out.append(records[pos : pos + length])
        pos += length
    return out, pos


def _decode_headers(
    records: bytes, pos: int, header_counts: tuple[int, ...]
) -> tuple[list[list[Header]], int]:
    size = len(records)
    out: list[list[Header]] = []
    for count in header_counts:
        record_headers: list[Header] = []
        for _ in range(count):
            if pos + 2 > size:
                raise CorruptMessageError("header name length runs past the records section")
            (name_length,) = _U16.unpack_from(records, pos)
            pos += 2
            if pos + name_length + 4 > size:
                raise CorruptMessageError("header name runs past the records section")
            try:
                name = records[pos : pos + name_length].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorruptMessageError("header name is not UTF-8") from exc
            pos += name_length
            (value_length,) = _I32.unpack_from(records, pos)
            pos += 4
            if value_length == -1:
                record_headers.append((name, None))
                continue
            if value_length < 0 or pos + value_length > size:
                raise CorruptMessageError(f"bad header value length {value_length}")
            record_headers.append((name, records[pos : pos + value_length]))
            pos += value_length
        out.append(record_headers)
    return out, pos

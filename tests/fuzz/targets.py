"""Fuzz targets for every decoder in ``fabric/protocol``: bytes in, a value or a FabricError out.

Each target takes one ``bytes`` input and feeds it to decoders. The property checked is
the one the protocol promises a node facing a hostile peer: a decoder returns a value or
raises a ``fabric.errors.FabricError`` subclass, never IndexError, struct.error,
MemoryError, RecursionError or anything else, and never allocates beyond the limits in
``fabric.limits`` (the fuzz driver caps the process RSS; see docs/SECURITY.md).

The targets are plain functions with no dependency on atheris, so a crash vector found by
the fuzzer is replayed by ``tests/unit/test_fuzz_vectors.py`` on any machine.

Multi-frame inputs (a whole request or response) are split with :func:`split_frames`:
``u16 length, bytes`` repeated, the last frame taking whatever is left. Schemas are read
from ``fabric.protocol.apis.SCHEMAS`` at import time, so an API added later is fuzzed
without touching this file.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Any

import lz4.frame

from fabric.errors import FabricError
from fabric.protocol import apis, batch, direct, queues, tags
from fabric.protocol import groups as group_format
from fabric.protocol import schema as s
from fabric.protocol.header import decode_header
from fabric.protocol.schema import Array, Struct

try:
    from fabric.protocol import _columns
except ImportError:  # not built: the columns target has nothing to compare
    _columns = None  # type: ignore[assignment]

Target = Callable[[bytes], None]

_U16 = struct.Struct("<H")
FRAMES_MAX = 8  # a fuzzed message has at most this many frames (enough for header+body+batches)


def schema_entries() -> list[tuple[str, s.Schema]]:
    """Every body schema the protocol declares, requests and responses, in a stable order."""
    out: list[tuple[str, s.Schema]] = [("ERROR_BODY", apis.ERROR_BODY)]
    for (key, version), (request, response) in sorted(apis.SCHEMAS.items()):
        name = apis.ApiKey(key).name if key in apis.ApiKey._value2member_map_ else str(key)
        out.append((f"{name}.v{version}.request", request))
        out.append((f"{name}.v{version}.response", response))
    # Queue-mode schemas are in apis.SCHEMAS; the queue state record the node stores is not.
    out.append(("QUEUE_STATE_RECORD", queues.STATE_RECORD_V0))
    return out


SCHEMA_ENTRIES = schema_entries()


def split_frames(data: bytes) -> list[bytes]:
    frames: list[bytes] = []
    pos = 0
    while len(frames) < FRAMES_MAX - 1 and pos + 2 <= len(data):
        (length,) = _U16.unpack_from(data, pos)
        pos += 2
        frames.append(data[pos : pos + length])
        pos += length
    if pos < len(data) or not frames:
        frames.append(data[pos:])
    return frames


def join_frames(frames: list[bytes]) -> bytes:
    """The inverse of :func:`split_frames` for up to FRAMES_MAX frames of < 64 KiB."""
    out = bytearray()
    for frame in frames[:-1]:
        out += _U16.pack(len(frame)) + frame
    last = frames[-1]
    # A last frame must not be readable as a length prefix by itself: prefix it too,
    # then a trailing empty frame is implied only when the count demands it.
    out += _U16.pack(len(last)) + last
    return bytes(out)


def _guard(call: Callable[[], Any]) -> None:
    try:
        call()
    except FabricError:
        pass


# --- targets -------------------------------------------------------------------------------


def fuzz_header(data: bytes) -> None:
    _guard(lambda: decode_header(data))


def fuzz_body(data: bytes) -> None:
    """First byte picks a schema (request or response of any API, or the error body)."""
    if not data:
        return
    _name, schema = SCHEMA_ENTRIES[data[0] % len(SCHEMA_ENTRIES)]
    _guard(lambda: s.decode(schema, data[1:]))


def fuzz_request(data: bytes) -> None:
    frames = split_frames(data)
    _guard(lambda: apis.decode_request(frames))


def fuzz_response(data: bytes) -> None:
    frames = split_frames(data)
    _guard(lambda: apis.decode_response(frames))


def _repair(buf: bytearray, mode: int) -> None:
    """Optionally make the fuzzed batch self-consistent so the fuzzer gets past the cheap
    checks (length, CRC) into decompression and the records section."""
    if len(buf) < batch.BATCH_HEADER_BYTES:
        return
    if mode & 0x01:
        struct.pack_into("<i", buf, 8, len(buf))
    if mode & 0x02:
        struct.pack_into("<I", buf, 16, zlib.crc32(memoryview(buf)[batch.CRC_START :]) & 0xFFFFFFFF)


def fuzz_batch(data: bytes) -> None:
    """First byte: bits 0-1 repair (length, CRC), bits 2-3 which reader."""
    if not data:
        return
    mode = data[0]
    buf = bytearray(data[1:])
    _repair(buf, mode)
    reader = (mode >> 2) & 0x03
    if reader == 0:
        _guard(lambda: batch.validate(buf, 1 << 30))
    elif reader == 1:
        _guard(lambda: batch.decode_batch(buf))
    elif reader == 2:
        _guard(lambda: batch.column_view(buf))
    else:
        _guard(lambda: batch.decode_batch(bytes(buf), check_crc=False))
    _guard(lambda: batch.read_header(buf))


def fuzz_batch_records(data: bytes) -> None:
    """A batch whose header is right (length, records_bytes, CRC) around a fuzzed records
    section, so every input gets past the cheap checks that stop most of ``batch``'s into
    decompression and the columns. First byte: bits 0-3 the record count less 1, bit 4 lz4,
    bit 5 records_bytes one above the section, bit 6 a timestamp-type bit, bit 7 the tag
    bloom bit. Beyond "a value or a FabricError": a batch validate() accepts is one the
    readers accept too (a node stores what validate passed; its consumers must read it)."""
    if not data:
        return
    mode, records = data[0], data[1:]
    count = (mode & 0x0F) + 1
    codec = batch.CODEC_LZ4 if mode & 0x10 else batch.CODEC_NONE
    payload = lz4.frame.compress(records, store_size=True) if codec == batch.CODEC_LZ4 else records
    attributes = codec | (batch.TIMESTAMP_LOG_APPEND if mode & 0x40 else 0) | (batch.TAG_BLOOM_PRESENT if mode & 0x80 else 0)
    buf = bytearray(batch.BATCH_HEADER_BYTES) + payload
    batch._HEADER.pack_into(buf, 0, 0, len(buf), -1, 0, 1, attributes, 0, count, 1_700_000_000_000,
                            1_700_000_000_000 + count, -1, -1, 0, -1, -1, len(records) + (1 if mode & 0x20 else 0))
    struct.pack_into("<I", buf, 16, batch.compute_crc(buf))
    try:
        header = batch.validate(buf, 1 << 30)
    except FabricError:
        _guard(lambda: batch.decode_batch(buf))
        _guard(lambda: batch.column_view(buf))
        return
    decoded = batch.decode_batch(buf)  # raises (a crash here) if validate was too lenient
    batch.column_view(buf)
    if len(decoded.values) != header.record_count:
        raise AssertionError(f"validate passed {header.record_count} records, decode_batch read {len(decoded.values)}")


def fuzz_tag_filter(data: bytes) -> None:
    """A FETCH v1 tag filter (fabric/protocol/tags.py): a client's string the node parses and
    then matches every batch against. First byte bit 0: the rest as UTF-8 (else latin-1);
    its first 4 bytes are also a tag bloom to match."""
    if not data:
        return
    raw = data[1:]
    text = raw.decode("utf-8", "replace") if data[0] & 1 else raw.decode("latin-1")
    try:
        tag_filter = tags.TagFilter(text)
    except FabricError:
        return
    tag_filter.matches(frozenset({"a", "b", "paid", text[:8]}))
    tag_filter.may_match(int.from_bytes(raw[:4].ljust(4, b"\0"), "little"))
    tag_filter.may_match(None)


def fuzz_columns(data: bytes) -> None:
    """The compiled records-section pass (fabric/protocol/_columns.pyx) against its pure
    twin: the first byte picks the record count, the rest is the section; both must give the
    same answer or refuse alike (a difference raises, which the fuzzer reports as a crash)."""
    if not data:
        return
    n, records = data[0] % 64 + 1, data[1:]
    if _columns is None or len(records) < batch.RECORD_FIXED_BYTES * n:
        return
    compiled, pure = _columns.record_columns(records, n), batch._record_columns_py(records, n)
    if compiled != pure:
        raise AssertionError(f"compiled {compiled} != pure {pure} for n={n}")


def fuzz_direct(data: bytes) -> None:
    """The direct plane's messages (fabric/protocol/direct.py); first byte bit 0: as a SUB
    socket receives them (subject first) or as a DEALER/ROUTER does."""
    if not data:
        return
    frames = split_frames(data[1:])
    _guard(lambda: direct.decode_message(frames, published=bool(data[0] & 1)))


def fuzz_state_record(data: bytes) -> None:
    """The records the coordinators replay on every leader change: ``__consumer_offsets``
    (key, value) and ``__queue_state`` values. One unreadable record must cost that record
    (a FabricError the loader skips), never the load: found when a client's garbage key in
    ``__consumer_offsets`` (UTF-8 that was not) stopped the node at every start."""
    frames = split_frames(data)
    key = frames[0]
    value = frames[1] if len(frames) > 1 else None
    _guard(lambda: group_format.decode_record(key, value))
    _guard(lambda: queues.decode_state_record(key))


TARGETS: dict[str, Target] = {
    "header": fuzz_header,
    "body": fuzz_body,
    "request": fuzz_request,
    "response": fuzz_response,
    "batch": fuzz_batch,
    "batch_records": fuzz_batch_records,
    "tag_filter": fuzz_tag_filter,
    "columns": fuzz_columns,
    "direct": fuzz_direct,
    "state_record": fuzz_state_record,
}


# --- seeds: valid inputs the fuzzer mutates from ------------------------------------------


def sample_value(ftype: s.FieldType) -> Any:
    if isinstance(ftype, Array):
        return [sample_value(ftype.item), sample_value(ftype.item)]
    if isinstance(ftype, Struct):
        return {name: sample_value(t) for name, t in ftype.fields}
    if ftype == "str":
        return "events"
    if ftype == "bytes":
        return b"\x01\x02"
    return 1


def sample_body(schema: s.Schema) -> bytes:
    return s.encode(schema, {name: sample_value(t) for name, t in schema})


def sample_batches() -> list[bytes]:
    out = []
    for codec in (batch.CODEC_NONE, batch.CODEC_LZ4):
        out.append(batch.encode_batch(
            [1_700_000_000_000, 1_700_000_000_005, 1_700_000_000_003],
            [b"key-1", None, b"key"],
            [b"hello", b"world", None],
            [[("trace", b"\x01\x02"), ("empty", None)], [], [("h", b"")]],
            codec=codec, producer_id=77, producer_epoch=3, base_sequence=10,
        ))
        out.append(batch.encode_batch([5], [None], [b"x" * 300], codec=codec))
    return out


def seeds(target: str) -> list[bytes]:
    batches = sample_batches()
    if target == "header":
        return [apis.encode_request(apis.ApiKey.METADATA, {"topics": ["a"]}, 7)[0]]
    if target == "body":
        return [bytes([i]) + sample_body(schema) for i, (_, schema) in enumerate(SCHEMA_ENTRIES)]
    if target == "request":
        out = []
        for (key, version), (request, _) in sorted(apis.SCHEMAS.items()):
            body = {name: sample_value(t) for name, t in request}
            extra = [batches[0]] * len(body["entries"]) if key == apis.ApiKey.PRODUCE else []
            out.append(join_frames(apis.encode_request(key, body, 9, api_version=version, batches=extra)))
        return out
    if target == "response":
        out = []
        for (key, version), (request, response) in sorted(apis.SCHEMAS.items()):
            header = decode_header(apis.encode_request(key, {n: sample_value(t) for n, t in request}, 9,
                                                       api_version=version)[0])
            body = {name: sample_value(t) for name, t in response}
            extra = [batches[1]] * (2 if key == apis.ApiKey.FETCH else 0)
            out.append(join_frames(apis.encode_response(header, body, extra)))
            out.append(join_frames(apis.encode_error_response(header, 7, "no such topic")))
        return out
    if target == "batch":
        return [bytes([mode]) + b for b in batches for mode in (0x00, 0x04, 0x08, 0x0C, 0x03, 0x07)]
    if target == "batch_records":  # the records sections of the sample batches, each codec
        sections = [(batch.read_header(b).record_count, batch.records_section(b, batch.read_header(b))) for b in batches]
        return [bytes([n - 1 | lz4_bit]) + sec for n, sec in sections for lz4_bit in (0x00, 0x10)]
    if target == "tag_filter":
        return [bytes([1]) + text.encode() for text in ("paid", "paid || refunded", "eu && !(test || dev)",
                                                         "(a && b) || (c && !d)")]
    if target == "columns":  # the records sections of the sample batches (uncompressed ones decode as they are)
        sections = [batch.records_section(b, batch.read_header(b)) for b in batches]
        return [bytes([batch.read_header(b).record_count - 1]) + sec for b, sec in zip(batches, sections, strict=True)]
    if target == "direct":
        return [bytes([0]) + join_frames(direct.request_frames(7, b"hi", timeout_ms=1500, idempotent=True,
                                                               headers={"trace": b"ab"})),
                bytes([0]) + join_frames(direct.error_frames(7, 52, "ValueError", "bad input")),
                bytes([0]) + join_frames(direct.ping_frames(200)),
                bytes([1]) + join_frames(direct.publish_frames("orders.eu", 9, 42, b"px", {"k": b"v"}))]
    if target == "state_record":
        members = [{"member_id": "m1", "instance_id": "", "member_epoch": 3, "previous_epoch": 2,
                    "session_timeout_ms": 45_000, "subscribed_topics": ["orders"], "subscribed_topic_regex": "",
                    "assignment": [{"topic": "orders", "partitions": [0, 1]}], "revoking": [], "principal": "alice"}]
        return [join_frames([group_format.offset_key("g1", "orders", 3), group_format.encode_offset_value(42, "m", 9)]),
                join_frames([group_format.group_key("g1"), group_format.encode_group_value(7, members)]),
                join_frames([queues.encode_state_record(5, "leased", 1, 1_000, "", last_offset=9)])]
    raise KeyError(target)

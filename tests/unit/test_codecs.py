"""Codecs refuse bad bytes with the right error and never over-allocate."""

from __future__ import annotations

import random
import struct
import zlib

import lz4.frame
import pytest

from fabric import errors
from fabric.limits import BATCH_HEADER_BYTES, MESSAGE_TEXT_BYTES_MAX
from fabric.protocol import apis, batch, schema
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import decode_header, encode_request_header


def sample(codec: int = batch.CODEC_LZ4, n: int = 50) -> bytes:
    return batch.encode_batch(
        [1_000 + i for i in range(n)],
        [b"k%d" % i if i % 3 else None for i in range(n)],
        [b"value-%d" % i for i in range(n)],
        [[("h", b"%d" % i)] if i % 5 == 0 else [] for i in range(n)],
        codec=codec,
    )


@pytest.mark.parametrize("codec", [batch.CODEC_NONE, batch.CODEC_LZ4])
def test_batch_round_trip(codec: int) -> None:
    raw = sample(codec)
    decoded = batch.decode_batch(raw)
    assert decoded.values == [b"value-%d" % i for i in range(50)]
    assert decoded.keys[0] is None and decoded.keys[1] == b"k1"
    assert decoded.headers[5] == [("h", b"5")] and decoded.headers[1] == []
    assert decoded.timestamps == [1_000 + i for i in range(50)]
    assert decoded.header.max_timestamp == 1_049


def test_stamp_keeps_crc_valid() -> None:
    raw = sample()
    for data in (raw, bytearray(raw), memoryview(raw)):
        out = batch.stamped(data, 123_456, 9)
        header = batch.validate(out, 1 << 20)
        assert (header.base_offset, header.leader_epoch) == (123_456, 9)
        # Only the two stamped fields differ; the input is left as it was.
        assert len(out) == len(raw) and out[8:12] == raw[8:12] and out[16:] == raw[16:]
        assert bytes(data) == raw


def test_an_lz4_frame_without_its_end_mark_is_corrupt_and_says_so() -> None:
    raw = batch.encode_batch([1_000] * 50, [None] * 50, [b"value-%d" % i for i in range(50)], codec=batch.CODEC_LZ4)
    cut = bytearray(raw[:-4])  # the frame's 4-byte end mark (no content checksum follows it)
    struct.pack_into("<i", cut, 8, len(cut))
    struct.pack_into("<I", cut, 16, batch.compute_crc(cut))
    header = batch.validate(cut, 1 << 20, contents=False)
    with pytest.raises(errors.CorruptMessageError, match="end mark is missing"):
        batch.records_section(cut, header)


def test_bad_crc_is_corrupt() -> None:
    buf = bytearray(sample())
    buf[-1] ^= 0xFF
    with pytest.raises(errors.CorruptMessageError, match="CRC"):
        batch.validate(buf, 1 << 20)
    with pytest.raises(errors.CorruptMessageError):
        batch.decode_batch(buf)


def test_truncated_batch_is_corrupt() -> None:
    raw = sample()
    for cut in (10, BATCH_HEADER_BYTES - 1, len(raw) - 3):
        with pytest.raises(errors.CorruptMessageError):
            batch.validate(raw[:cut], 1 << 20)


def test_too_large_for_topic() -> None:
    with pytest.raises(errors.MessageTooLargeError, match="message_bytes_max"):
        batch.validate(sample(), 100)


def forge(records_bytes: int, payload: bytes, codec: int = batch.CODEC_LZ4, count: int = 1) -> bytes:
    """A batch with a correct CRC around whatever payload and size claim we like."""
    head = bytearray(struct.pack("<qiiIBBHiqqqhhiqi", 0, BATCH_HEADER_BYTES + len(payload), -1, 0, 1, codec, 0,
                                 count, 0, 0, -1, -1, 0, -1, -1, records_bytes))
    body = bytes(head) + payload
    crc = batch.compute_crc(body)
    struct.pack_into("<I", head, 16, crc)
    return bytes(head) + payload


def xxh32(data: bytes, seed: int = 0) -> int:
    """Plain XXH32, enough to forge a valid lz4 frame-header checksum."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    n, i = len(data), 0
    if n >= 16:
        v = [(seed + p1 + p2) & mask, (seed + p2) & mask, seed & mask, (seed - p1) & mask]
        while i + 16 <= n:
            for j in range(4):
                lane = int.from_bytes(data[i + 4 * j : i + 4 * j + 4], "little")
                v[j] = (rotl((v[j] + lane * p2) & mask, 13) * p1) & mask
            i += 16
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & mask
    else:
        h = (seed + p5) & mask
    h = (h + n) & mask
    while i + 4 <= n:
        h = (rotl((h + int.from_bytes(data[i : i + 4], "little") * p3) & mask, 17) * p4) & mask
        i += 4
    while i < n:
        h = (rotl((h + data[i] * p5) & mask, 11) * p1) & mask
        i += 1
    h ^= h >> 15
    h = (h * p2) & mask
    h ^= h >> 13
    h = (h * p3) & mask
    return h ^ (h >> 16)


def lz4_frame_claiming(content_size: int) -> bytes:
    """A real lz4 frame of 100 zero bytes whose header claims ``content_size`` bytes."""
    frame = bytearray(lz4.frame.compress(b"\0" * 100, store_size=True))
    struct.pack_into("<Q", frame, 6, content_size)  # magic(4) FLG(1) BD(1) then the size
    frame[14] = (xxh32(bytes(frame[4:14])) >> 8) & 0xFF  # header checksum over FLG..size
    return bytes(frame)


def test_forged_frame_is_valid_lz4() -> None:
    assert lz4.frame.get_frame_info(lz4_frame_claiming(100))["content_size"] == 100
    assert lz4.frame.decompress(lz4_frame_claiming(100)) == b"\0" * 100


def test_lz4_bomb_refused_before_allocating() -> None:
    # A frame that claims 64 GiB: refused on the claim, before anything is allocated.
    bomb = lz4_frame_claiming(64 << 30)
    assert lz4.frame.get_frame_info(bomb)["content_size"] == 64 << 30
    raw = forge(100, bomb)
    with pytest.raises(errors.DecompressionLimitError, match="claims"):
        batch.validate(raw, 1 << 20)
    with pytest.raises(errors.DecompressionLimitError):
        batch.decode_batch(raw)


def test_records_bytes_above_limit_refused() -> None:
    raw = forge(1 << 30, lz4.frame.compress(b"x" * 20))
    with pytest.raises(errors.DecompressionLimitError):
        batch.validate(raw, 1 << 20)


def test_lz4_claim_must_match_header() -> None:
    raw = forge(14, lz4.frame.compress(b"\0" * 28))
    with pytest.raises(errors.DecompressionLimitError):
        batch.validate(raw, 1 << 20)


def test_column_lengths_past_end_are_corrupt() -> None:
    # One record whose value length says 1,000 bytes but the section has 2.
    records = struct.pack("<iiiH", 0, -1, 1000, 0) + b"ab"
    raw = forge(len(records), records, codec=batch.CODEC_NONE)
    with pytest.raises(errors.CorruptMessageError):
        batch.decode_batch(raw)


def test_readers_refuse_timestamps_past_the_i64_range() -> None:
    """first_timestamp is a node's to send: a record it puts past the i64 range is refused
    by decode_batch and column_view (the leader's check refuses such records on produce)."""
    hi, lo = batch.TIMESTAMP_MS_MAX, batch.TIMESTAMP_MS_MIN
    assert batch.decode_batch(batch.encode_batch([hi - 1, hi], [None] * 2, [b"a", b"b"])).timestamps == [hi - 1, hi]
    assert batch.column_view(batch.encode_batch([lo + 1, lo], [None] * 2, [b"a", b"b"])).header.first_timestamp == lo + 1
    for first, second in ((hi, 1), (lo, -1)):
        raw = bytearray(batch.encode_batch([0, second], [None] * 2, [b"a", b"b"]))
        struct.pack_into("<q", raw, 28, first)  # first_timestamp; the second record's delta stays
        struct.pack_into("<I", raw, 16, zlib.crc32(memoryview(raw)[20:]) & 0xFFFFFFFF)
        for read in (batch.decode_batch, batch.column_view):
            with pytest.raises(errors.CorruptMessageError, match="outside the i64 range"):
                read(bytes(raw))


def test_schema_truncated_and_trailing() -> None:
    sch = apis.METADATA_REQUEST_V0
    good = schema.encode(sch, {"topics": ["a", "bc"]})
    with pytest.raises(errors.MalformedRequestError, match="truncated"):
        schema.decode(sch, good[:-1])
    with pytest.raises(errors.MalformedRequestError, match="trailing"):
        schema.decode(sch, good + b"\0")


def test_schema_array_count_lie() -> None:
    with pytest.raises(errors.MalformedRequestError):
        schema.decode(apis.METADATA_REQUEST_V0, struct.pack("<I", 999_999))


def test_schema_bad_utf8() -> None:
    with pytest.raises(errors.MalformedRequestError, match="UTF-8"):
        schema.decode(apis.METADATA_REQUEST_V0, struct.pack("<IH", 1, 2) + b"\xff\xfe")


def test_header_errors() -> None:
    with pytest.raises(errors.InvalidMagicError):
        decode_header(b"XXXX" + bytes(12))
    with pytest.raises(errors.MalformedRequestError):
        decode_header(encode_request_header(1, 0, 5)[:10])
    bad_version = bytearray(encode_request_header(1, 0, 5))
    bad_version[4] = 9
    with pytest.raises(errors.UnsupportedVersionError):
        decode_header(bytes(bad_version))


def test_decode_request_frame_counts() -> None:
    frames = apis.encode_request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 1000,
                                                  "entries": [{"topic": "t", "partition": 0}]}, 1, batches=[sample()])
    assert apis.decode_request(frames).header.correlation_id == 1
    with pytest.raises(errors.MalformedRequestError, match="batch frames"):
        apis.decode_request(frames[:-1])
    with pytest.raises(errors.MalformedRequestError, match="batch frames"):
        apis.decode_request([*frames, b"extra"])
    with pytest.raises(errors.MalformedRequestError, match="no body"):
        apis.decode_request(frames[:1])


def test_request_header_flags_and_error_code_are_zero() -> None:
    """Both are reserved on requests (PROTOCOL.md section 2); a request with either set, a
    response sent back as a request for one, is refused with its correlation id."""
    frames = apis.encode_request(ApiKey.METADATA, {"topics": []}, 9)
    for offset, value in ((5, 1), (5, 0x80), (10, 3)):
        header = bytearray(frames[0])
        header[offset] = value
        with pytest.raises(errors.MalformedRequestError, match="0 on a request") as raised:
            apis.decode_request([bytes(header), *frames[1:]])
        assert raised.value.header.correlation_id == 9  # type: ignore[attr-defined]


def test_unknown_api_and_version() -> None:
    with pytest.raises(errors.UnknownApiError):
        apis.decode_request([encode_request_header(999, 0, 1), b""])
    with pytest.raises(errors.UnsupportedVersionError, match=r"supported 0\.\.0"):
        apis.decode_request([encode_request_header(ApiKey.METADATA, 7, 1), b""])


def _two_records() -> bytes:
    good = batch.encode_batch([1, 2], [None, b"k"], [b"a", b"b"], [[("h", b"v")], None])
    return batch.records_section(good, batch.read_header(good))


@pytest.mark.parametrize(
    "name",
    ["junk after the lz4 frame", "garbage lz4 block", "lz4 frame without its end mark",
     "column lengths short of the section", "uncompressed section with a trailing byte",
     "key length past the end", "header count past the end"],
)
def test_batch_whose_records_do_not_decode_is_refused_on_produce(name: str) -> None:
    # Each of these has a valid CRC and a consistent header: only a look inside finds them.
    recs = _two_records()
    frame = lz4.frame.compress(recs, store_size=True, content_checksum=False)
    key_past = bytearray(recs)
    struct.pack_into("<i", key_past, 12, 1_000)  # record 1's key length
    headers_past = bytearray(recs)
    struct.pack_into("<H", headers_past, 26, 3)  # record 1 claims three headers
    raw = {
        "junk after the lz4 frame": forge(len(recs), frame + b"junk", count=2),
        "garbage lz4 block": forge(len(recs), frame[:15] + bytes(len(frame) - 15), count=2),
        "lz4 frame without its end mark": forge(len(recs), frame[:-4], count=2),
        "column lengths short of the section": forge(len(recs) + 3, lz4.frame.compress(recs + b"xyz", store_size=True), count=2),
        "uncompressed section with a trailing byte": forge(len(recs) + 1, recs + b"x", codec=batch.CODEC_NONE, count=2),
        "key length past the end": forge(len(recs), bytes(key_past), codec=batch.CODEC_NONE, count=2),
        "header count past the end": forge(len(recs), bytes(headers_past), codec=batch.CODEC_NONE, count=2),
    }[name]
    batch.validate(raw, 1 << 20, contents=False)  # the cheap checks alone pass it
    with pytest.raises(errors.CorruptMessageError):
        batch.validate(raw, 1 << 20)
    with pytest.raises(errors.CorruptMessageError):
        batch.decode_batch(raw)


@pytest.mark.parametrize("codec", [batch.CODEC_NONE, batch.CODEC_LZ4])
def test_whatever_passes_validation_decodes(codec: int) -> None:
    recs = _two_records()
    payload = recs if codec == batch.CODEC_NONE else lz4.frame.compress(recs, store_size=True)
    raw = forge(len(recs), payload, codec=codec, count=2)
    batch.validate(raw, 1 << 20)
    assert batch.decode_batch(raw).values == [b"a", b"b"]
    assert batch.validate(sample(codec), 1 << 20).record_count == 50


def test_error_text_is_bounded_so_a_reply_always_encodes() -> None:
    # A reply that quotes a 65,535-byte topic name must still fit its str field.
    name = "é" * 32_767 + "x"
    assert len(name.encode()) == 65_535
    message = f"unknown topic {name!r}"
    for text in (message, "\udcff" * 10, "short"):
        cut = schema.bounded_text(text)
        assert len(cut.encode("utf-8")) <= MESSAGE_TEXT_BYTES_MAX
    assert schema.bounded_text("short") == "short"
    assert schema.bounded_text(message).endswith(schema.TEXT_CUT_MARK)
    body = schema.encode(apis.PRODUCE_RESPONSE_V0, {"results": [
        {"topic": name, "partition": 0, "error": 7, "base_offset": -1, "log_start_offset": -1, "message": message}]})
    decoded = schema.decode(apis.PRODUCE_RESPONSE_V0, body)["results"][0]
    assert decoded["topic"] == name and decoded["message"].startswith("unknown topic 'éé")
    header = decode_header(encode_request_header(ApiKey.PRODUCE, 0, 5))
    frames = apis.encode_error_response(header, errors.MalformedRequestError.code, message)
    assert apis.decode_response(frames).body["message"] == schema.bounded_text(message)


def test_unknown_protocol_version_keeps_the_header_for_the_answer() -> None:
    raw = bytearray(encode_request_header(ApiKey.METADATA, 0, 4242))
    raw[4] = 9
    with pytest.raises(errors.UnsupportedVersionError) as caught:
        decode_header(bytes(raw))
    header = caught.value.header  # type: ignore[attr-defined]
    assert (header.api_key, header.api_version, header.correlation_id) == (ApiKey.METADATA, 0, 4242)
    answer = decode_header(apis.encode_error_response(header, errors.UnsupportedVersionError.code, "v9")[0])
    assert (answer.api_key, answer.correlation_id, answer.protocol_version, answer.is_response) == (1, 4242, 1, True)


def test_adaptive_compression_sends_incompressible_records_uncompressed() -> None:
    import os

    from fabric.protocol import batch as bf

    random_values = [os.urandom(1024) for _ in range(40)]
    repeated = [b"the same value, again and again " * 32] * 40
    for values, codec in ((random_values, bf.CODEC_NONE), (repeated, bf.CODEC_LZ4), ([b"abc"] * 3, bf.CODEC_NONE)):
        data = bf.encode_batch([1] * len(values), [None] * len(values), values, adaptive=True)
        assert bf.read_header(data).codec == codec
        bf.validate(data, 8 << 20)
        assert bf.decode_batch(data).values == values
    # without adaptive the codec asked for is kept (the vectors depend on it)
    assert bf.read_header(bf.encode_batch([1], [None], [b"abc"])).codec == bf.CODEC_LZ4


def test_the_batch_crc_is_zlibs_crc32_whatever_computes_it() -> None:
    """fabric/protocol/batch.py computes the batch CRC with isal's crc32 when it is
    installed (hardware carry-less multiply): the wire format is zlib's CRC-32, which the
    C client and section 4.4 of docs/PROTOCOL.md name, so the two must agree everywhere."""
    rng = random.Random(5)
    for size in [20, 21, 22, 35, 84, 100, 1000, 4096, 65_537, 262_144 + 3]:
        buf = rng.randbytes(size)
        assert batch.compute_crc(buf) == zlib.crc32(buf[batch.CRC_START:]) & 0xFFFFFFFF
    encoded = batch.encode_batch([1_700_000_000_000] * 50, [None] * 50, [rng.randbytes(100) for _ in range(50)])
    assert batch.read_header(encoded).crc == zlib.crc32(encoded[batch.CRC_START:]) & 0xFFFFFFFF

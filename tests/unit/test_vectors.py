"""The shared hex vectors decode to the values in the JSON files and re-encode byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric.protocol import batch, schema
from fabric.protocol.header import decode_header, encode_header
from fabric.protocol.keyhash import key_hash, partition_for_key
from tests.vectors import generate

VECTORS = Path(__file__).parent.parent / "vectors"


def read_hex(name: str) -> bytes:
    return bytes.fromhex((VECTORS / name).read_text().strip())


def test_committed_vectors_match_the_generator() -> None:
    # If this fails, the format changed: regenerate on purpose (and update the C tests).
    for name, data in generate.vectors().items():
        on_disk = (VECTORS / name).read_text()
        expected = data.hex() + "\n" if isinstance(data, bytes) else data
        assert on_disk == expected, name


@pytest.mark.parametrize("name", ["header_request.hex", "header_response.hex"])
def test_header_round_trip(name: str) -> None:
    raw = read_hex(name)
    assert encode_header(decode_header(raw)) == raw


def test_header_fields() -> None:
    h = decode_header(read_hex("header_response.hex"))
    assert (h.api_key, h.api_version, h.correlation_id, h.error_code, h.is_response) == (3, 0, 0xFFFFFFFE, 8, True)


@pytest.mark.parametrize("name,codec", [("batch_none.hex", batch.CODEC_NONE), ("batch_lz4.hex", batch.CODEC_LZ4)])
def test_batch_vectors(name: str, codec: int) -> None:
    raw = read_hex(name)
    spec = json.loads((VECTORS / "batch.json").read_text())
    decoded = batch.decode_batch(raw)
    h = decoded.header
    assert h.codec == codec
    assert (h.base_offset, h.leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence) == (
        spec["base_offset"], spec["leader_epoch"], spec["producer_id"], spec["producer_epoch"], spec["base_sequence"])
    assert decoded.timestamps == spec["timestamps"]
    assert [None if k is None else k.hex() for k in decoded.keys] == spec["keys"]
    assert [None if v is None else v.hex() for v in decoded.values] == spec["values"]
    assert [[[n, None if v is None else v.hex()] for n, v in hs] for hs in decoded.headers] == spec["headers"]
    assert generate.make_batch(codec) == raw
    assert batch.validate(raw, 1 << 20) == h


def test_body_vectors_round_trip() -> None:
    spec = json.loads((VECTORS / "bodies.json").read_text())
    for name, entry in spec.items():
        raw = read_hex(f"{name}.hex")
        sch = generate.body_schema(entry["api_key"], entry["response"])
        assert schema.decode(sch, raw) == entry["values"], name
        assert schema.encode(sch, entry["values"]) == raw, name


def test_keyhash_vectors() -> None:
    lines = [line.split() for line in (VECTORS / "keyhash.txt").read_text().splitlines() if not line.startswith("#")]
    assert len(lines) >= 30
    for key_hex, count, crc_hex, partition in lines:
        key = b"" if key_hex == "-" else bytes.fromhex(key_hex)
        assert key_hash(key) == int(crc_hex, 16)
        assert partition_for_key(key, int(count)) == int(partition)


def test_crc_check_value() -> None:
    # The standard CRC-32 check value, as quoted in docs/PROTOCOL.md.
    assert key_hash(b"123456789") == 0xCBF43926


def test_key_hash_spreads_keys() -> None:
    counts = [0] * 6
    for i in range(60_000):
        counts[partition_for_key(b"user-%d" % i, 6)] += 1
    assert min(counts) > 9_000

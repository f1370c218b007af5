"""The consumer-group and tag vectors decode to groups.json and re-encode byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

from fabric.protocol import apis, batch, schema, tags
from tests.vectors import generate_groups

VECTORS = Path(__file__).parents[1] / "vectors"


def test_group_body_vectors_round_trip() -> None:
    spec = json.loads((VECTORS / "groups.json").read_text())
    assert len(spec) >= 10
    for name, entry in spec.items():
        raw = bytes.fromhex((VECTORS / f"{name}.hex").read_text().strip())
        request_schema, response_schema = apis.SCHEMAS[(entry["api_key"], entry["api_version"])]
        sch = response_schema if entry["response"] else request_schema
        assert schema.decode(sch, raw) == entry["values"], name
        assert schema.encode(sch, entry["values"]) == raw, name


def test_tagged_batch_vector() -> None:
    raw = bytes.fromhex((VECTORS / "batch_tagged.hex").read_text().strip())
    assert generate_groups.tagged_batch() == raw
    header = batch.validate(raw, 1 << 20)
    assert header.attributes == batch.TAG_BLOOM_PRESENT | batch.CODEC_NONE
    assert batch.tag_bloom(raw) == tags.bloom_of(["paid", "eu", "refunded"])
    assert raw[22:24].hex() + raw[54:56].hex() != "00000000"
    assert [tags.record_tags(h) for h in batch.decode_batch(raw).headers] == [{"paid", "eu"}, {"refunded"}]

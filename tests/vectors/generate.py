"""Write the shared test vectors (python tests/vectors/generate.py).

The vectors are committed; tests/unit/test_vectors.py checks that decoding them gives the
values in the .json files and that re-encoding gives the same bytes, and the C client's
tests do the same. Rerun this only when the format changes on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fabric.protocol import apis, batch
from fabric.protocol import schema as s
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import Header, encode_header
from fabric.protocol.keyhash import key_hash

HERE = Path(__file__).parent

BATCH_RECORDS: dict[str, Any] = {
    "timestamps": [1700000000000, 1700000000005, 1700000000003],
    "keys": ["6b65792d31", None, "6b6579"],  # hex; null = no key
    "values": ["68656c6c6f", "776f726c64", None],
    "headers": [[["trace", "0102"], ["empty", None]], [], [["h", ""]]],
    "producer_id": 77,
    "producer_epoch": 3,
    "base_sequence": 10,
    "global_id_base": -1,
    "base_offset": 42,
    "leader_epoch": 7,
}

# Body frames of each API, as (api key, response?, values).
BODIES: dict[str, tuple[int, bool, dict[str, Any]]] = {
    "metadata_request": (ApiKey.METADATA, False, {"topics": ["events", "orders"]}),
    "metadata_response": (ApiKey.METADATA, True, {
        "controller_id": 1,
        "nodes": [{"node_id": 1, "address": "tcp://127.0.0.1:9092"}, {"node_id": 2, "address": "tcp://127.0.0.1:9093"}],
        "topics": [
            {"error": 0, "name": "events", "strict_order": 0, "message_bytes_max": 8388608, "partitions": [
                {"partition": 0, "error": 0, "leader": 1, "leader_epoch": 0, "replicas": [1, 2], "isr": [1, 2]},
                {"partition": 1, "error": 0, "leader": 2, "leader_epoch": 3, "replicas": [2, 1], "isr": [2]},
            ]},
            {"error": 7, "name": "orders", "strict_order": 0, "message_bytes_max": 0, "partitions": []},
        ],
    }),
    "produce_request": (ApiKey.PRODUCE, False, {
        "acks": -1, "timeout_ms": 30000, "entries": [{"topic": "events", "partition": 1}]}),
    "produce_response": (ApiKey.PRODUCE, True, {"results": [
        {"topic": "events", "partition": 1, "error": 0, "base_offset": 42, "log_start_offset": 0, "message": ""},
        {"topic": "events", "partition": 2, "error": 2, "base_offset": -1, "log_start_offset": -1,
         "message": "batch CRC mismatch"}]}),
    "fetch_request": (ApiKey.FETCH, False, {
        "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1048576,
        "partitions": [{"topic": "events", "partition": 1, "fetch_offset": 42,
                        "partition_bytes_max": 65536, "current_leader_epoch": -1}]}),
    "fetch_response": (ApiKey.FETCH, True, {"partitions": [
        {"topic": "events", "partition": 1, "error": 0, "high_watermark": 45, "log_start_offset": 0,
         "log_end_offset": 45, "batch_count": 1}]}),
    "list_offsets_request": (ApiKey.LIST_OFFSETS, False, {"partitions": [
        {"topic": "events", "partition": 0, "timestamp": -2},
        {"topic": "events", "partition": 0, "timestamp": 1700000000000}]}),
    "list_offsets_response": (ApiKey.LIST_OFFSETS, True, {"partitions": [
        {"topic": "events", "partition": 0, "error": 0, "timestamp": -1, "offset": 0},
        {"topic": "events", "partition": 0, "error": 0, "timestamp": 1700000000003, "offset": 17}]}),
    "create_topic_request": (ApiKey.CREATE_TOPIC, False, {
        "name": "events", "partitions": 6, "replication_factor": 3,
        "configs": [{"key": "retention_ms", "value": "86400000"}]}),
    "allocate_ids_request": (ApiKey.ALLOCATE_IDS, False, {"count": 1000, "kind": 0}),
    "allocate_ids_response": (ApiKey.ALLOCATE_IDS, True, {"epoch": 3, "first_id": 2000001, "count": 1000,
                                                           "records_end": 2001001}),
    "error_response": (-1, True, {"message": "header magic 0x00000000, expected 0x31524246 (FBR1)"}),
}

KEYHASH_KEYS = [b"", b"a", b"key-1", b"user-42", b"123456789", bytes(range(16)), "ключ".encode()]
KEYHASH_COUNTS = [1, 3, 6, 16, 1000]


def body_schema(api_key: int, response: bool) -> s.Schema:
    if api_key == -1:
        return apis.ERROR_BODY
    request, resp = apis.SCHEMAS[(api_key, 0)]
    return resp if response else request


def make_batch(codec: int) -> bytes:
    r = BATCH_RECORDS
    return batch.encode_batch(
        r["timestamps"],
        [None if k is None else bytes.fromhex(k) for k in r["keys"]],
        [None if v is None else bytes.fromhex(v) for v in r["values"]],
        [[(n, None if v is None else bytes.fromhex(v)) for n, v in hs] for hs in r["headers"]],
        codec=codec,
        producer_id=r["producer_id"],
        producer_epoch=r["producer_epoch"],
        base_sequence=r["base_sequence"],
        global_id_base=r["global_id_base"],
        base_offset=r["base_offset"],
        leader_epoch=r["leader_epoch"],
    )


def vectors() -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    out["header_request.hex"] = encode_header(Header(ApiKey.PRODUCE, 0, 0x01020304))
    out["header_response.hex"] = encode_header(Header(ApiKey.FETCH, 0, 0xFFFFFFFE, error_code=8, flags=1))
    out["batch_none.hex"] = make_batch(batch.CODEC_NONE)
    out["batch_lz4.hex"] = make_batch(batch.CODEC_LZ4)
    out["batch.json"] = json.dumps(BATCH_RECORDS, indent=1, sort_keys=True) + "\n"
    for name, (api_key, response, values) in BODIES.items():
        out[f"{name}.hex"] = s.encode(body_schema(api_key, response), values)
    out["bodies.json"] = json.dumps(
        {name: {"api_key": k, "response": r, "values": v} for name, (k, r, v) in BODIES.items()},
        indent=1, sort_keys=True) + "\n"
    lines = ["# key_hex partition_count crc32_hex partition"]
    for key in KEYHASH_KEYS:
        for count in KEYHASH_COUNTS:
            h = key_hash(key)
            lines.append(f"{key.hex() or '-'} {count} {h:08x} {h % count}")
    out["keyhash.txt"] = "\n".join(lines) + "\n"
    return out


def main() -> None:
    for name, data in vectors().items():
        path = HERE / name
        if isinstance(data, bytes):
            path.write_text(data.hex() + "\n")
        else:
            path.write_text(data)
        print("wrote", path)


if __name__ == "__main__":
    main()

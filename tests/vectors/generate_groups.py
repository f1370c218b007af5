"""Write the consumer-group and tag vectors (python tests/vectors/generate_groups.py).

Kept apart from ``generate.py`` because the C client does not speak the group APIs yet
(its vector test decodes every body in ``bodies.json``). ``groups.json`` lists each body
with its api key, version and direction; ``tests/unit/test_group_vectors.py`` decodes
every ``<name>.hex`` and re-encodes it byte for byte. Rerun only on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fabric.protocol import apis, batch, tags
from fabric.protocol import schema as s
from fabric.protocol.apis import ApiKey

HERE = Path(__file__).parent

TP = [{"topic": "orders", "partitions": [0, 2]}]
GROUP_BODIES: dict[str, tuple[int, int, bool, dict[str, Any]]] = {
    "find_coordinator_request": (ApiKey.FIND_COORDINATOR, 0, False, {"group_id": "billing"}),
    "find_coordinator_response": (ApiKey.FIND_COORDINATOR, 0, True, {
        "error": 0, "message": "", "node_id": 2, "address": "tcp://127.0.0.1:9093", "partition": 5}),
    "consumer_group_heartbeat_request": (ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, False, {
        "group_id": "billing", "member_id": "5f0c", "member_epoch": 3, "instance_id": "host-a",
        "session_timeout_ms": 45000, "subscribed_topics": ["orders"], "subscribed_topic_regex": "",
        "owned": TP}),
    "consumer_group_heartbeat_response": (ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, True, {
        "error": 0, "message": "", "member_id": "5f0c", "member_epoch": 4, "heartbeat_interval_ms": 3000,
        "assignment": [{"topic": "orders", "partitions": [0]}]}),
    "offset_commit_request": (ApiKey.OFFSET_COMMIT, 0, False, {
        "group_id": "billing", "member_id": "5f0c", "member_epoch": 4,
        "offsets": [{"topic": "orders", "partition": 0, "offset": 1234, "metadata": "batch-7"}]}),
    "offset_commit_response": (ApiKey.OFFSET_COMMIT, 0, True, {
        "error": 0, "message": "", "results": [{"topic": "orders", "partition": 0, "error": 0}]}),
    "offset_fetch_request": (ApiKey.OFFSET_FETCH, 0, False, {
        "group_id": "billing", "partitions": [{"topic": "orders", "partition": 0}]}),
    "offset_fetch_response": (ApiKey.OFFSET_FETCH, 0, True, {
        "error": 0, "message": "", "offsets": [{"topic": "orders", "partition": 0, "offset": 1234,
                                               "metadata": "batch-7", "commit_ms": 1700000000000}]}),
    "describe_groups_response": (ApiKey.DESCRIBE_GROUPS, 0, True, {"groups": [{
        "error": 0, "group_id": "billing", "state": "reconciling", "group_epoch": 9, "members": [{
            "member_id": "5f0c", "instance_id": "", "member_epoch": 4, "subscribed_topics": [],
            "subscribed_topic_regex": "orders\\..*", "assignment": TP, "revoking": []}]}]}),
    "fetch_request_v1": (ApiKey.FETCH, 1, False, {
        "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1048576,
        "partitions": [{"topic": "events", "partition": 1, "fetch_offset": 42, "partition_bytes_max": 65536,
                        "current_leader_epoch": -1}], "tag_filter": "paid || refunded"}),
    "fetch_response_v1": (ApiKey.FETCH, 1, True, {"partitions": [
        {"topic": "events", "partition": 1, "error": 0, "high_watermark": 90, "log_start_offset": 0,
         "log_end_offset": 90, "batch_count": 0, "next_fetch_offset": 90, "filtered_bytes": 5321}]}),
}


def tagged_batch() -> bytes:
    headers = [[(tags.TAGS_HEADER, b"paid,eu")], [(tags.TAGS_HEADER, b"refunded")]]
    return batch.encode_batch([1700000000000, 1700000000001], [None, b"k"], [b"a", b"b"], headers,
                              codec=batch.CODEC_NONE, tag_bloom=tags.batch_bloom(headers))


def vectors() -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for name, (api_key, version, response, values) in GROUP_BODIES.items():
        request_schema, response_schema = apis.SCHEMAS[(api_key, version)]
        out[f"{name}.hex"] = s.encode(response_schema if response else request_schema, values)
    out["groups.json"] = json.dumps(
        {name: {"api_key": k, "api_version": v, "response": r, "values": vals}
         for name, (k, v, r, vals) in GROUP_BODIES.items()}, indent=1, sort_keys=True) + "\n"
    out["batch_tagged.hex"] = tagged_batch()
    return out


def main() -> None:
    for name, data in vectors().items():
        path = HERE / name
        path.write_text(data.hex() + "\n" if isinstance(data, bytes) else data)
        print("wrote", path)


if __name__ == "__main__":
    main()

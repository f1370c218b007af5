"""A deeply nested tag filter on a live node: a FETCH v1 with ``"!" * 999 + "a"`` or 400
nested parentheses (both under FILTER_BYTES_MAX) raised RecursionError in the node's
parser: UNKNOWN_SERVER_ERROR and a traceback in its log. Now it is INVALID_REQUEST naming
FILTER_NESTING_MAX, and the node goes on serving filtered fetches."""

from __future__ import annotations

import pytest

from fabric import errors
from fabric.local import LocalCluster
from fabric.protocol import apis
from fabric.protocol import tags as tags_format
from fabric.protocol.apis import ApiKey
from sdk import Admin, Consumer, Producer
from tests.integration.helpers import decode, leader_address, raw_request


def fetch_v1(address: str, topic: str, tag_filter: str) -> apis.Message:
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "tag_filter": tag_filter,
            "partitions": [{"topic": topic, "partition": 0, "fetch_offset": 0, "partition_bytes_max": 1 << 20,
                            "current_leader_epoch": -1}]}
    return decode(raw_request(address, apis.encode_request(ApiKey.FETCH, body, 5, api_version=1)))


@pytest.mark.parametrize("deep", ["!" * 999 + "a", "(" * 400 + "a" + ")" * 400])
def test_deep_filter_is_an_invalid_request_and_the_node_serves_on(cluster: LocalCluster, topic_name: str,
                                                                   deep: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(cluster.bootstrap) as producer:
        producer.send(topic_name, b"paid", partition=0, tags=("paid",)).result(10)
    address = leader_address(cluster.bootstrap, topic_name)
    reply = fetch_v1(address, topic_name, deep)
    assert reply.header.error_code == errors.InvalidRequestError.code
    assert f"FILTER_NESTING_MAX={tags_format.FILTER_NESTING_MAX}" in reply.body["message"]
    ok = fetch_v1(address, topic_name, "paid || (eu && !refunded)")
    assert ok.header.error_code == 0 and ok.body["partitions"][0]["error"] == 0
    assert ok.body["partitions"][0]["batch_count"] == 1
    with pytest.raises(errors.InvalidRequestError, match="FILTER_NESTING_MAX"):
        Consumer(cluster.bootstrap, tag_filter=deep)  # the SDK refuses it before sending

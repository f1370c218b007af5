"""REPLICA_ACK on a real cluster: version 1 (a follower's ack right after a write) is not
answered, version 0 is; followers still learn the high watermark (docs/PROTOCOL.md 5.9);
the high watermark's move answers waiting readers before waiting writers."""

from __future__ import annotations

import time
from typing import Any

import zmq

from fabric.local import LocalCluster
from fabric.protocol import apis, batch
from fabric.protocol.apis import ApiKey
from sdk import Admin, Producer
from tests.integration.helpers import decode, raw_request

REPLY_WAIT_MS = 1_000
HW_WAIT_S = 10.0


def ask(address: str, version: int, body: dict[str, Any]) -> apis.Message | None:
    """The leader's answer, or None if none came within REPLY_WAIT_MS."""
    try:
        return decode(raw_request(address, apis.encode_request(ApiKey.REPLICA_ACK, body, 7, api_version=version),
                                  timeout_ms=REPLY_WAIT_MS))
    except TimeoutError:
        return None


def test_one_way_acks_are_not_answered_and_followers_still_learn_the_hw(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
        p = admin.describe_topic(topic_name).partitions[0]
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(50):
                producer.send(topic_name, b"%d" % i, partition=0)
            producer.flush(30)
        follower = next(r for r in p.replicas if r != p.leader)
        address = admin.nodes()[p.leader]
        # What the follower already reported, as it would report it: nothing changes.
        body = {"replica_id": follower, "partitions": [
            {"topic": topic_name, "partition": 0, "leader_epoch": p.leader_epoch, "log_end_offset": 50}]}
        answer = ask(address, 0, body)
        assert answer is not None and not answer.header.error_code
        [result] = answer.body["partitions"]
        assert (result["error"], result["high_watermark"], result["log_end_offset"]) == (0, 50, 50)
        assert ask(address, 1, body) is None
        # An ack for an epoch the leader does not have is refused in the body, not answered.
        stale = {"replica_id": follower, "partitions": [dict(body["partitions"][0], leader_epoch=p.leader_epoch - 1)]}
        assert ask(address, 1, stale) is None
        # The followers' high watermarks follow the leader's through the answered acks.
        deadline = time.monotonic() + HW_WAIT_S
        while True:
            copies = admin.describe_replicas([topic_name])[(topic_name, 0)]
            if len(copies) == 3 and all(c["high_watermark"] == 50 for c in copies):
                break
            assert time.monotonic() < deadline, copies
            time.sleep(0.05)


def test_a_report_past_the_leaders_log_end_does_not_count_a_follower(fresh_cluster: LocalCluster,
                                                                       topic_name: str) -> None:
    """Any plaintext client can send REPLICA_ACK (or a replica FETCH). One claiming each
    follower holds offset 10**15 made the leader count them as holding everything for the
    rest of its term: with both followers stopped, an acks=all write was then acknowledged
    at once, held by the leader alone. A report is now capped at the leader's log end and
    replaced by the follower's next one."""
    from fabric import errors

    cluster = fresh_cluster
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
        p = admin.describe_topic(topic_name).partitions[0]
        address = admin.nodes()[p.leader]
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send(topic_name, b"warm", partition=0).result(30)
    followers = [r for r in p.replicas if r != p.leader]
    for follower in followers:
        ask(address, 0, {"replica_id": follower, "partitions": [
            {"topic": topic_name, "partition": 0, "leader_epoch": p.leader_epoch, "log_end_offset": 10**15}]})
    for follower in followers:
        cluster.nodes[follower].pause()
    try:
        with Producer(cluster.bootstrap, acks="all", request_timeout_ms=1_500, delivery_timeout_ms=3_000) as producer:
            future = producer.send(topic_name, b"only on the leader", partition=0)
            try:
                future.result(10)
                acknowledged = True
            except errors.FabricError:
                acknowledged = False
            producer.flush(10)
    finally:
        for follower in followers:
            cluster.nodes[follower].resume()
    assert not acknowledged


def test_a_high_watermark_move_answers_the_waiting_reader_before_the_writer(cluster: LocalCluster, topic_name: str) -> None:
    """When the followers' acks move the high watermark, the leader answers the fetches
    parked for that data before the acks=all produces that wrote it (nodes/server.py,
    CHANGE_LISTENERS): the data is committed either way, and a reader that gets it first
    is what end-to-end latency measures (docs/DESIGN.md, "Readers first"). One connection
    carries a FETCH parked at the log end, then an acks=all PRODUCE; both wait for the same
    move, and the order of their answers on the connection is the order they were sent in."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
        with Producer(cluster.bootstrap, acks="all") as producer:
            end = producer.send(topic_name, b"first", partition=0).result(timeout=30).offset + 1
        address = admin.nodes()[admin.describe_topic(topic_name).partitions[0].leader]
    fetch = apis.encode_request(ApiKey.FETCH, {
        "replica_id": apis.CONSUMER_REPLICA_ID, "max_wait_ms": 20_000, "min_bytes": 1, "max_bytes": 1 << 20,
        "partitions": [{"topic": topic_name, "partition": 0, "fetch_offset": end, "partition_bytes_max": 1 << 20,
                        "current_leader_epoch": apis.ANY_LEADER_EPOCH}]}, 1)
    produce = apis.encode_request(ApiKey.PRODUCE, {"acks": -1, "timeout_ms": 20_000,
                                                   "entries": [{"topic": topic_name, "partition": 0}]}, 2,
                                  batches=[batch.encode_batch([1], [None], [b"second"])])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    answered: list[int] = []
    try:
        sock.send_multipart(fetch)
        sock.send_multipart(produce)
        while len(answered) < 2:
            assert sock.poll(30_000), f"answers so far: {answered}"
            message = decode(sock.recv_multipart())
            answered.append(message.header.correlation_id)
            if message.header.correlation_id == 1:
                assert message.body["partitions"][0]["batch_count"] == 1  # the record the produce wrote
    finally:
        sock.close(linger=0)
    assert answered == [1, 2]

"""Bad input sent as raw frames to a live node: a clear error code, nothing changed,
and the node keeps serving good traffic."""

from __future__ import annotations

import os
import struct
import time

import pytest
import zmq

from fabric import errors
from fabric.limits import PROTOCOL_VERSION
from fabric.local import LocalCluster
from fabric.protocol import apis, batch
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import encode_request_header
from sdk import Admin, Producer
from tests.integration.helpers import (
    RAW_TIMEOUT_MS,
    decode,
    leader_address,
    leader_id,
    raw_request,
    read_all,
)
from tests.integration.test_metrics_endpoint import endpoints, scrape
from tests.unit.test_codecs import forge, lz4_frame_claiming


@pytest.fixture(scope="module")
def bad_topic(cluster: LocalCluster) -> str:
    name = "bad-input-topic"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=1, config={"message_bytes_max": 4096})
    with Producer(cluster.bootstrap) as producer:
        producer.send(name, b"before", partition=0).result(10)
    return name


def produce_frames(topic: str, partition: int, batch_bytes: bytes, correlation_id: int = 7) -> list[bytes]:
    return apis.encode_request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 5000,
                                                "entries": [{"topic": topic, "partition": partition}]},
                               correlation_id, batches=[batch_bytes])


def good_batch() -> bytes:
    return batch.encode_batch([1, 2], [None, None], [b"a", b"b"])


def produce_error(cluster: LocalCluster, topic: str, batch_bytes: bytes, partition: int = 0) -> tuple[int, str]:
    reply = decode(raw_request(leader_address(cluster.bootstrap, topic), produce_frames(topic, partition, batch_bytes)))
    assert reply.header.error_code == 0
    result = reply.body["results"][0]
    return result["error"], result["message"]


def assert_still_serving(cluster: LocalCluster, topic: str) -> None:
    with Producer(cluster.bootstrap) as producer:
        producer.send(topic, b"after", partition=0).result(10)
    values = [r.value for r in read_all(cluster.bootstrap, topic, 1)]
    assert values[0] == b"before" and values[-1] == b"after"
    assert b"a" not in values  # nothing from a refused batch was stored


def request_level_error(address: str, frames: list[bytes]) -> tuple[int, str, int]:
    reply = raw_request(address, frames)
    message = decode(reply)
    return message.header.error_code, message.body["message"], message.header.correlation_id


def test_wrong_magic(cluster: LocalCluster, bad_topic: str) -> None:
    frames = produce_frames(bad_topic, 0, good_batch())
    frames[0] = b"XXXX" + frames[0][4:]
    code, message, _ = request_level_error(leader_address(cluster.bootstrap, bad_topic), frames)
    assert code == errors.InvalidMagicError.code and "FBR1" in message
    assert_still_serving(cluster, bad_topic)


def test_wrong_protocol_version(cluster: LocalCluster, bad_topic: str) -> None:
    frames = produce_frames(bad_topic, 0, good_batch(), correlation_id=99)
    header = bytearray(frames[0])
    header[4] = 2
    frames[0] = bytes(header)
    code, _, correlation_id = request_level_error(leader_address(cluster.bootstrap, bad_topic), frames)
    assert code == errors.UnsupportedVersionError.code and correlation_id == 99
    assert_still_serving(cluster, bad_topic)


def test_request_with_reserved_header_fields_set(cluster: LocalCluster, bad_topic: str) -> None:
    frames = produce_frames(bad_topic, 0, good_batch(), correlation_id=41)
    header = bytearray(frames[0])
    header[5] = 1  # the response flag, on a request
    frames[0] = bytes(header)
    code, message, correlation_id = request_level_error(leader_address(cluster.bootstrap, bad_topic), frames)
    assert code == errors.MalformedRequestError.code and "flags 0x01" in message and correlation_id == 41
    assert_still_serving(cluster, bad_topic)


def test_unknown_api_version(cluster: LocalCluster, bad_topic: str) -> None:
    frames = [encode_request_header(ApiKey.METADATA, 9, 5), b""]
    code, message, _ = request_level_error(leader_address(cluster.bootstrap, bad_topic), frames)
    assert code == errors.UnsupportedVersionError.code and "supported 0..0" in message


def test_truncated_header_and_body(cluster: LocalCluster, bad_topic: str) -> None:
    address = leader_address(cluster.bootstrap, bad_topic)
    frames = produce_frames(bad_topic, 0, good_batch())
    assert request_level_error(address, [frames[0][:9]])[0] == errors.MalformedRequestError.code
    assert request_level_error(address, [frames[0], frames[1][:-3], frames[2]])[0] == errors.MalformedRequestError.code
    assert request_level_error(address, [frames[0]])[0] == errors.MalformedRequestError.code
    assert_still_serving(cluster, bad_topic)


def test_extra_and_missing_frames(cluster: LocalCluster, bad_topic: str) -> None:
    address = leader_address(cluster.bootstrap, bad_topic)
    frames = produce_frames(bad_topic, 0, good_batch())
    code, message, _ = request_level_error(address, [*frames, good_batch()])
    assert code == errors.MalformedRequestError.code and "batch frames" in message
    assert request_level_error(address, frames[:2])[0] == errors.MalformedRequestError.code
    assert_still_serving(cluster, bad_topic)


def test_bad_crc(cluster: LocalCluster, bad_topic: str) -> None:
    corrupt = bytearray(good_batch())
    corrupt[-1] ^= 0x55
    code, message = produce_error(cluster, bad_topic, bytes(corrupt))
    assert code == errors.CorruptMessageError.code and "CRC" in message
    assert_still_serving(cluster, bad_topic)


def test_truncated_batch(cluster: LocalCluster, bad_topic: str) -> None:
    code, _ = produce_error(cluster, bad_topic, good_batch()[:-4])
    assert code == errors.CorruptMessageError.code
    assert_still_serving(cluster, bad_topic)


def test_batch_above_topic_limit(cluster: LocalCluster, bad_topic: str) -> None:
    big = batch.encode_batch([1], [None], [bytes(range(256)) * 40], codec=batch.CODEC_NONE)
    code, message = produce_error(cluster, bad_topic, big)
    assert code == errors.MessageTooLargeError.code and "4096" in message
    assert_still_serving(cluster, bad_topic)


def test_lz4_bomb(cluster: LocalCluster, bad_topic: str) -> None:
    code, message = produce_error(cluster, bad_topic, forge(100, lz4_frame_claiming(64 << 30)))
    assert code == errors.DecompressionLimitError.code and "claims" in message
    assert_still_serving(cluster, bad_topic)


def test_unknown_topic_and_partition(cluster: LocalCluster, bad_topic: str) -> None:
    address = leader_address(cluster.bootstrap, bad_topic)
    reply = decode(raw_request(address, produce_frames("no-such-topic", 0, good_batch())))
    assert reply.body["results"][0]["error"] == errors.UnknownTopicOrPartitionError.code
    reply = decode(raw_request(address, produce_frames(bad_topic, 7, good_batch())))
    assert reply.body["results"][0]["error"] == errors.UnknownTopicOrPartitionError.code
    assert_still_serving(cluster, bad_topic)


def test_fetch_out_of_range(cluster: LocalCluster, bad_topic: str) -> None:
    address = leader_address(cluster.bootstrap, bad_topic)
    frames = apis.encode_request(ApiKey.FETCH, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
        "partitions": [{"topic": bad_topic, "partition": 0, "fetch_offset": 1_000_000,
                        "partition_bytes_max": 1 << 20, "current_leader_epoch": -1}]}, 3)
    result = decode(raw_request(address, frames)).body["partitions"][0]
    assert result["error"] == errors.OffsetOutOfRangeError.code
    assert result["log_start_offset"] == 0 and result["log_end_offset"] >= 1
    assert_still_serving(cluster, bad_topic)


def test_invalid_acks_and_garbage_body(cluster: LocalCluster, bad_topic: str) -> None:
    address = leader_address(cluster.bootstrap, bad_topic)
    frames = produce_frames(bad_topic, 0, good_batch())
    body = bytearray(frames[1])
    body[0] = 7  # acks = 7
    assert request_level_error(address, [frames[0], bytes(body), frames[2]])[0] == errors.InvalidRequestError.code
    garbage = struct.pack("<bi", 1, 1000) + struct.pack("<I", 5) + b"\xff" * 3
    assert request_level_error(address, [frames[0], garbage, frames[2]])[0] == errors.MalformedRequestError.code
    assert_still_serving(cluster, bad_topic)


def test_refused_requests_add_no_metric_series_per_api_key(cluster: LocalCluster, bad_topic: str) -> None:
    """A refusal echoes the client's api key (here a wrong protocol version), and the node
    labelled its error counter with it: a client could add a series per key, 65,536 of
    them (20,000 requests made 20,000 series and 3.5 MB per scrape)."""
    address = leader_address(cluster.bootstrap, bad_topic)
    keys = range(1_000, 1_300)  # none is an ApiKey
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        for key in keys:
            frame = bytearray(encode_request_header(key, 0, key))
            frame[4] = PROTOCOL_VERSION + 1
            sock.send_multipart([bytes(frame), b""])
        answered = 0
        while answered < len(keys) and sock.poll(RAW_TIMEOUT_MS):
            assert decode(sock.recv_multipart()).header.error_code == errors.UnsupportedVersionError.code
            answered += 1
    finally:
        sock.close(linger=0)
    assert answered == len(keys)
    known = {key.name for key in ApiKey}
    samples = scrape(endpoints(cluster)[leader_id(cluster.bootstrap, bad_topic)])
    unknown = {dict(labels)["api"] for (name, labels) in samples
               if name == "fabric_request_errors_total" and dict(labels)["api"] not in known}
    assert unknown == {"UNKNOWN"}
    assert_still_serving(cluster, bad_topic)


def test_a_client_that_never_reads_gets_a_bounded_amount_of_data(cluster: LocalCluster, topic_name: str) -> None:
    """ZeroMQ bounds a node's queue to a client by messages only, and a FETCH answer may
    carry 64 MiB: a client sending fetches and never reading made a node hold every answer
    (an audit: 57 MB to 4.5 GB). Answers not yet taken are bounded by bytes
    (nodes/reply_budget.py): past CLIENT_REPLY_BYTES_MAX a fetch reads nothing. Once the
    client reads, it gets data again."""
    from nodes.reply_budget import CLIENT_REPLY_BYTES_MAX

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, config={"message_bytes_max": 8 << 20})
    chunk = 4 << 20
    with Producer(cluster.bootstrap, acks="all", compression="none", batch_bytes_max=chunk + 4096) as producer:
        for _ in range(2):
            producer.send(topic_name, os.urandom(chunk), partition=0).result(60)  # a 4 MiB batch each
    address = leader_address(cluster.bootstrap, topic_name)
    fetches = 2 * CLIENT_REPLY_BYTES_MAX // (2 * chunk) + 30  # twice the bound's worth, and more
    request = apis.encode_request(ApiKey.FETCH, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 2 * chunk + 65536,
        "partitions": [{"topic": topic_name, "partition": 0, "fetch_offset": 0,
                        "partition_bytes_max": 2 * chunk + 65536, "current_leader_epoch": -1}]}, 3)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(address)
    try:
        for _ in range(fetches):
            sock.send_multipart(request)  # and read nothing meanwhile
        time.sleep(2.0)  # every fetch answered (max_wait_ms 0) into the unread queue
        with_data = 0
        for _ in range(fetches):
            assert sock.poll(30_000), "a fetch went unanswered"
            reply = decode(sock.recv_multipart())
            with_data += reply.body["partitions"][0]["batch_count"] > 0
        # The bound's worth (plus what the kernel's socket buffers took), not all of them.
        assert with_data <= CLIENT_REPLY_BYTES_MAX // (2 * chunk) + 4, with_data
        sock.send_multipart(request)
        assert sock.poll(30_000)
        assert decode(sock.recv_multipart()).body["partitions"][0]["batch_count"] == 2  # read: served again
    finally:
        sock.close(linger=0)
    with Producer(cluster.bootstrap) as producer:
        assert producer.send(topic_name, b"after", partition=0).result(10).offset == 2


def test_a_state_record_with_counts_past_i64_does_not_break_queue_describe(cluster: LocalCluster, topic_name: str) -> None:
    """A snapshot record in ``__queue_state`` whose ``fabric.snapshot.finished`` counts do not
    fit an i64 (written with PRODUCE version 1, which a plaintext cluster takes from anyone)
    went into the group's totals when the queue's leader loaded it, and every QUEUE_DESCRIBE
    of the group then failed with UNKNOWN_SERVER_ERROR and a traceback in the node's log
    (struct.error encoding ``dropped``). Such counts are unreadable: counted as 0, with a
    warning (found by a structure-aware live fuzzer)."""
    from fabric.protocol import queues as qp
    from nodes.queue_durable import STATE_TOPIC_PARTITIONS, state_partition
    from sdk import QueueConsumer

    warm, queue = f"{topic_name}-warm", topic_name
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(warm, partitions=1)
        admin.create_queue(queue, partitions=1)
        incarnation = admin.describe_topic(queue).configs["created_ms"].encode()
    with QueueConsumer(cluster.bootstrap, warm, group="g") as consumer:  # __queue_state exists after this
        consumer.receive(max_messages=1, wait_ms=0)
    with Producer(cluster.bootstrap) as producer:
        producer.send(queue, b"m", partition=0).result(10)
    k = state_partition(queue, 0, STATE_TOPIC_PARTITIONS)
    record = qp.encode_state_record(0, qp.STATE_USED, 0, 0, "")
    headers = [(qp.HEADER_STATE_INCARNATION, incarnation), ("fabric.snapshot", b"s.1"),
               ("fabric.snapshot.finished", b"5 99999999999999999999999")]
    poisoned = batch.encode_batch([1], [qp.state_key(queue, 0, "g")], [record], [headers])
    deadline = time.monotonic() + 20
    while True:  # the internal topic's leaders may still be settling
        reply = decode(raw_request(leader_address(cluster.bootstrap, qp.STATE_TOPIC, k), apis.encode_request(
            ApiKey.PRODUCE, {"acks": -1, "timeout_ms": 5000, "entries": [{"topic": qp.STATE_TOPIC, "partition": k}]},
            1, api_version=apis.INTERNAL_VERSION, batches=[poisoned])))
        if reply.body["results"][0]["error"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert reply.body["results"][0]["error"] == 0, reply.body
    address = leader_address(cluster.bootstrap, queue)
    while True:  # the first request for the queue starts its leader's load of that record
        answer = decode(raw_request(address, apis.encode_request(ApiKey.QUEUE_DESCRIBE, {"queue": queue, "group": "g"}, 2)))
        if answer.header.error_code != errors.CoordinatorLoadInProgressError.code or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer.header.error_code == 0, answer.body
    (counts,) = answer.body["partitions"]
    assert (counts["visible"], counts["dead_lettered"], counts["dropped"]) == (1, 0, 0)

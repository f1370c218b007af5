"""Bad input never stops a node or poisons a partition.

A live cluster gets the inputs issue 10 found (a 65,535-byte topic name, batches with a
valid CRC that do not decode, 4,098 frames, an unknown protocol version, ELECT_LEADERS
on a non-controller, fetches at the log end) and then a seeded corpus of random and
mutated frames. Every input that the protocol says is answered gets an answer in a
documented shape; afterwards the node process is alive, good traffic works, and every
batch stored in the partition decodes.
"""

from __future__ import annotations

import os
import random
import struct
import time
from collections.abc import Iterator
from typing import Any

import lz4.frame
import pytest
import zmq

from fabric import errors
from fabric.errors import error_for_code
from fabric.limits import MESSAGE_TEXT_BYTES_MAX, REQUEST_FRAMES_MAX, STRING_BYTES_MAX
from fabric.local import LocalCluster
from fabric.protocol import apis, batch
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import decode_header, encode_request_header
from sdk import Admin, Producer
from tests.integration.helpers import (
    decode,
    leader_address,
    raw_request,
    read_all,
    topic_with_one_record,
)
from tests.unit.test_codecs import forge
from tests.vectors import generate

FUZZ_INPUTS = 3_000
ANSWER_TIMEOUT_MS = 10_000
SEED = int(os.environ.get("FABRIC_FUZZ_SEED", "20261122"))
HUGE_NAME = "t" * STRING_BYTES_MAX


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster) -> str:
    return topic_with_one_record(cluster.bootstrap, "fuzzed")


def produce_frames(topic: str, batch_bytes: bytes, *, acks: int = 1, correlation_id: int = 7) -> list[bytes]:
    return apis.encode_request(ApiKey.PRODUCE, {"acks": acks, "timeout_ms": 5000,
                                                "entries": [{"topic": topic, "partition": 0}]},
                               correlation_id, batches=[batch_bytes])


def good_batch(value: bytes = b"fuzz-good") -> bytes:
    return batch.encode_batch([1], [None], [value])


def assert_healthy(cluster: LocalCluster, topic: str) -> None:
    assert all(node.process.running for node in cluster.nodes.values()), "a node stopped"
    with Producer(cluster.bootstrap) as producer:
        producer.send(topic, b"after", partition=0).result(20)
    # Every stored batch decodes: the consumer checks CRC, decompression and columns.
    values = [r.value for r in read_all(cluster.bootstrap, topic, 1)]
    assert values[0] == b"before" and values[-1] == b"after"


def test_huge_topic_name_gets_documented_errors(cluster: LocalCluster, topic: str) -> None:
    address = leader_address(cluster.bootstrap, topic)
    reply = decode(raw_request(address, produce_frames(HUGE_NAME, good_batch())))
    result = reply.body["results"][0]
    assert reply.header.error_code == 0 and result["topic"] == HUGE_NAME
    assert result["error"] == errors.UnknownTopicOrPartitionError.code
    assert len(result["message"].encode()) <= MESSAGE_TEXT_BYTES_MAX
    for api, body in [(ApiKey.CREATE_TOPIC, {"name": HUGE_NAME, "partitions": 1, "replication_factor": 1, "configs": []}),
                      (ApiKey.DELETE_TOPIC, {"name": HUGE_NAME}),
                      (ApiKey.CREATE_PARTITIONS, {"name": HUGE_NAME, "partitions": 2})]:
        reply = decode(raw_request(address, apis.encode_request(api, body, 11)))
        assert reply.header.error_code == 0, reply.body
        assert reply.body["error"] in (errors.InvalidTopicError.code, errors.UnknownTopicOrPartitionError.code), reply.body
        assert "Error" not in reply.body["message"] and len(reply.body["message"].encode()) <= MESSAGE_TEXT_BYTES_MAX
    assert_healthy(cluster, topic)


def test_batches_that_do_not_decode_are_refused_not_stored(cluster: LocalCluster, topic: str) -> None:
    address = leader_address(cluster.bootstrap, topic)
    records = batch.records_section(good_batch(), batch.read_header(good_batch()))
    frame = lz4.frame.compress(records, store_size=True, content_checksum=False)
    for bad in (forge(len(records), frame + b"junk"),
                forge(len(records), frame[:15] + bytes(len(frame) - 15)),
                forge(len(records) + 3, lz4.frame.compress(records + b"xyz", store_size=True))):
        reply = decode(raw_request(address, produce_frames(topic, bad)))
        assert reply.body["results"][0]["error"] == errors.CorruptMessageError.code
    assert_healthy(cluster, topic)


def test_too_many_frames_is_answered(cluster: LocalCluster, topic: str) -> None:
    address = leader_address(cluster.bootstrap, topic)
    frames = produce_frames(topic, good_batch(), correlation_id=4098)
    frames += [good_batch()] * (REQUEST_FRAMES_MAX + 1 - len(frames))
    assert len(frames) == 4_098
    reply = decode(raw_request(address, frames))
    assert reply.header.error_code == errors.MalformedRequestError.code
    assert reply.header.correlation_id == 4098 and "4097" in reply.body["message"].replace(",", "")
    assert_healthy(cluster, topic)


def test_unknown_protocol_version_echoes_the_header(cluster: LocalCluster, topic: str) -> None:
    frames = apis.encode_request(ApiKey.METADATA, {"topics": []}, 31337)
    header = bytearray(frames[0])
    header[4] = 2
    reply = raw_request(leader_address(cluster.bootstrap, topic), [bytes(header), frames[1]])
    answer = decode_header(reply[0])
    assert (answer.error_code, answer.api_key, answer.correlation_id) == (
        errors.UnsupportedVersionError.code, ApiKey.METADATA, 31337)


def test_not_controller_is_in_the_body(cluster: LocalCluster, topic: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        nodes = admin.nodes()
    controller = decode(raw_request(next(iter(nodes.values())), apis.encode_request(
        ApiKey.METADATA, {"topics": []}, 1))).body["controller_id"]
    other = next(address for node_id, address in nodes.items() if node_id != controller)
    reply = decode(raw_request(other, apis.encode_request(ApiKey.ELECT_LEADERS, {"topics": []}, 2)))
    assert reply.header.error_code == 0
    assert reply.body["error"] == errors.NotControllerError.code and reply.body["moved"] == 0


def fetch_frames(topic: str, offset: int, *, max_wait_ms: int, min_bytes: int, correlation_id: int) -> list[bytes]:
    return apis.encode_request(ApiKey.FETCH, {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": 1 << 20,
        "partitions": [{"topic": topic, "partition": 0, "fetch_offset": offset,
                        "partition_bytes_max": 1 << 20, "current_leader_epoch": -1}]}, correlation_id)


def test_fetch_at_the_log_end_is_held_not_answered_with_the_last_batch(cluster: LocalCluster, topic: str) -> None:
    address = leader_address(cluster.bootstrap, topic)
    probe = decode(raw_request(address, fetch_frames(topic, 0, max_wait_ms=0, min_bytes=1, correlation_id=1)))
    end = probe.body["partitions"][0]["high_watermark"]
    assert end >= 1
    # At the end, with a short wait: held, then answered empty (never the last batch again).
    reply = decode(raw_request(address, fetch_frames(topic, end, max_wait_ms=300, min_bytes=1, correlation_id=2)))
    assert reply.body["partitions"][0]["error"] == 0 and reply.body["partitions"][0]["batch_count"] == 0
    # min_bytes=0 answers at once, even with the longest wait allowed.
    reply = decode(raw_request(address, fetch_frames(topic, end, max_wait_ms=60_000, min_bytes=0, correlation_id=3),
                               timeout_ms=ANSWER_TIMEOUT_MS))
    assert reply.body["partitions"][0]["batch_count"] == 0
    # A held fetch is answered as soon as a record arrives.
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(fetch_frames(topic, end, max_wait_ms=30_000, min_bytes=1, correlation_id=4))
        time.sleep(0.2)
        with Producer(cluster.bootstrap, acks=1) as producer:
            producer.send(topic, b"wake", partition=0).result(10)
        assert sock.poll(ANSWER_TIMEOUT_MS), "a held fetch was not answered when data arrived"
        answer = apis.decode_response(sock.recv_multipart())
        assert answer.body["partitions"][0]["batch_count"] == 1
        assert batch.decode_batch(answer.batches[0]).values == [b"wake"]
    finally:
        sock.close(linger=0)


# -- the seeded corpus ------------------------------------------------------------------------
def _valid_requests(topic: str) -> list[list[bytes]]:
    bodies = {name: entry for name, entry in generate.BODIES.items() if not entry[1]}
    out = [apis.encode_request(api, values, 1, batches=[good_batch()] if api == ApiKey.PRODUCE else None)
           for api, _response, values in bodies.values()]
    out.append(produce_frames(topic, good_batch()))
    out.append(produce_frames(topic, batch.encode_batch([1, 2], [b"k", None], [b"a", None], [[("h", b"v")], None],
                                                        codec=batch.CODEC_NONE)))
    out.append(apis.encode_request(ApiKey.API_VERSIONS, {}, 1))
    out.append(apis.encode_request(ApiKey.DESCRIBE_TOPICS, {"names": [topic]}, 1))
    out.append(apis.encode_request(ApiKey.INIT_PRODUCER_ID, {"client_id": "fuzz"}, 1))
    return out


def _mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    for _ in range(rng.randint(1, 3)):
        index = rng.randrange(len(frames))
        frame = bytearray(frames[index])
        action = rng.randrange(6)
        if action == 0 and frame:  # flip bits
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
        elif action == 1 and frame:  # truncate
            del frame[rng.randrange(len(frame)):]
        elif action == 2:  # append junk
            frame += rng.randbytes(rng.randint(1, 16))
        elif action == 3 and len(frame) >= 4:  # a length field gone wild
            pos = rng.randrange(len(frame) - 3)
            struct.pack_into("<I", frame, pos, rng.choice([0, 1, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]))
        elif action == 4:  # drop or duplicate a frame
            if rng.random() < 0.5 and len(frames) > 1:
                del frames[index]
                continue
            frames.insert(index, bytes(frame))
        else:  # overwrite a byte of the header
            header = bytearray(frames[0])
            if header:
                header[rng.randrange(len(header))] = rng.randrange(256)
            frames[0] = bytes(header)
            continue
        frames[index] = bytes(frame)
    return frames


def _random_request(rng: random.Random) -> list[bytes]:
    header = encode_request_header(rng.randrange(16), rng.randrange(2), rng.randrange(1 << 32))
    return [header] + [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(0, 3))]


def _expects_answer(frames: list[bytes]) -> tuple[bool, int]:
    """(whether the protocol promises a prompt answer, the correlation id it will carry)."""
    if frames and not frames[0]:
        frames = frames[1:]  # an empty first frame is a REQ-style delimiter to the node
    if not frames:
        return True, 0  # "empty message": refused with correlation id 0
    try:
        header = decode_header(frames[0])
    except errors.UnsupportedVersionError as exc:
        return True, exc.header.correlation_id  # type: ignore[attr-defined]
    except errors.FabricError:
        return True, 0
    if header.api_key == ApiKey.FETCH:
        return False, header.correlation_id  # may be held for max_wait_ms: not waited for
    if header.api_key == ApiKey.PRODUCE:
        try:
            message = apis.decode_request(frames)
        except errors.FabricError:
            return True, header.correlation_id
        return message.body["acks"] != 0, header.correlation_id
    return True, header.correlation_id


@pytest.fixture
def dealer(cluster: LocalCluster, topic: str) -> Iterator[zmq.Socket[Any]]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(leader_address(cluster.bootstrap, topic))
    try:
        yield sock
    finally:
        sock.close(linger=0)


def test_fuzz_corpus_never_stops_the_node(cluster: LocalCluster, topic: str, dealer: zmq.Socket[Any]) -> None:
    rng = random.Random(SEED)
    valid = _valid_requests(topic)
    answered = 0
    for i in range(FUZZ_INPUTS):
        frames = _random_request(rng) if rng.random() < 0.2 else _mutate(rng, rng.choice(valid))
        if not frames:
            continue
        expected, correlation_id = _expects_answer(frames)
        dealer.send_multipart(frames)
        if not expected:
            continue
        deadline = time.monotonic() + ANSWER_TIMEOUT_MS / 1000
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            assert remaining_ms > 0 and dealer.poll(remaining_ms), (
                f"input {i} got no answer (reproduce with FABRIC_FUZZ_SEED={SEED}): {[f[:40].hex() for f in frames]}")
            reply = dealer.recv_multipart()
            if reply and not reply[0]:
                reply = reply[1:]  # the node echoes a delimiter it was sent
            answer = decode_header(reply[0])
            assert answer.is_response
            if answer.error_code:
                assert error_for_code(answer.error_code).code == answer.error_code
                apis.decode_response(reply)  # a request-level error has exactly the documented body
            if answer.correlation_id == correlation_id:
                break
        answered += 1
    assert answered > FUZZ_INPUTS // 2
    assert_healthy(cluster, topic)


def test_metadata_right_after_create_topic_has_all_partitions_or_none(cluster: LocalCluster) -> None:
    """CREATE_TOPIC answered, then METADATA at once to the same node: the topic's config
    and its partition states reach the node's cache by separate watches, and the answer
    showed 1 or 2 of 3 partitions (or none) with error 0, so a client following PROTOCOL.md
    section 6 hashed keys over the wrong count. Now all, or LEADER_NOT_AVAILABLE (retriable)."""
    from fabric.transport import Connections

    address = next(iter(Admin(cluster.bootstrap).nodes().values()))
    conns = Connections()
    seen: set[tuple[int, int]] = set()
    try:
        for i in range(20):
            name = f"imm-{os.getpid()}-{i}"
            created = conns.request(address, ApiKey.CREATE_TOPIC, {
                "name": name, "partitions": 3, "replication_factor": 3, "configs": []}, timeout_ms=30_000)
            assert created.body["error"] == 0, created.body
            topic = conns.request(address, ApiKey.METADATA, {"topics": [name, name]}, timeout_ms=10_000).body["topics"]
            assert len(topic) == 1  # asked twice, answered once
            seen.add((topic[0]["error"], len(topic[0]["partitions"])))
    finally:
        conns.close()
    assert seen <= {(0, 3), (errors.LeaderNotAvailableError.code, 0), (errors.UnknownTopicOrPartitionError.code, 0)}, seen


def test_a_name_asked_for_many_times_is_answered_once(cluster: LocalCluster, topic: str) -> None:
    """DESCRIBE_TOPICS with 100,000 copies of one topic name (a 600 KB request) made a node
    build 58 MB of answer and stall its loop for 9-11 s (its ISRs shrank, its coordinator
    partitions moved), and DESCRIBE_GROUPS with 100,000 copies of a group id did the same to
    the group's coordinator (3 s and 17 MB for a one-member group). Each is answered once,
    as METADATA answers a name asked for twice (found by a structure-aware live fuzzer)."""
    from fabric.limits import NAMES_PER_REQUEST_MAX

    address = leader_address(cluster.bootstrap, topic)
    many = NAMES_PER_REQUEST_MAX  # 100,000 found it; now refused whole (the test below)
    reply = decode(raw_request(address, apis.encode_request(ApiKey.DESCRIBE_TOPICS, {"names": [topic] * many}, 1)))
    assert [t["name"] for t in reply.body["topics"]] == [topic]
    reply = decode(raw_request(address, apis.encode_request(
        ApiKey.DESCRIBE_TOPICS, {"names": [topic, "no-such-topic", topic]}, 2)))
    assert [(t["name"], t["error"]) for t in reply.body["topics"]] == [
        (topic, 0), ("no-such-topic", errors.UnknownTopicOrPartitionError.code)]
    reply = decode(raw_request(address, apis.encode_request(ApiKey.DESCRIBE_GROUPS, {"group_ids": ["g"] * many}, 3)))
    assert [g["group_id"] for g in reply.body["groups"]] == ["g"]


def test_more_names_than_a_request_may_carry_are_refused_before_any_work(cluster: LocalCluster, topic: str) -> None:
    """A million distinct names (8.9 MB) held a node's loop 5-6 s in METADATA, DESCRIBE_TOPICS
    or DESCRIBE_GROUPS; above NAMES_PER_REQUEST_MAX the request is refused whole. The SDK asks
    for every topic instead when it needs more than that by name."""
    from fabric.limits import NAMES_PER_REQUEST_MAX

    address = leader_address(cluster.bootstrap, topic)
    many = [f"n{i}" for i in range(NAMES_PER_REQUEST_MAX + 1)]
    for correlation_id, (api, body) in enumerate([(ApiKey.METADATA, {"topics": many}),
                                                  (ApiKey.DESCRIBE_TOPICS, {"names": many}),
                                                  (ApiKey.DESCRIBE_GROUPS, {"group_ids": many}),
                                                  (ApiKey.DELETE_GROUPS, {"group_ids": many})], start=1):
        reply = decode(raw_request(address, apis.encode_request(api, body, correlation_id)))
        assert reply.header.error_code == errors.InvalidRequestError.code, (api, reply)
        assert "NAMES_PER_REQUEST_MAX" in reply.body["message"]
    reply = decode(raw_request(address, apis.encode_request(ApiKey.METADATA, {"topics": many[:NAMES_PER_REQUEST_MAX]}, 9)))
    assert reply.header.error_code == 0 and len(reply.body["topics"]) == NAMES_PER_REQUEST_MAX
    with Admin(cluster.bootstrap) as admin:  # its MetadataClient, as every client's
        assert admin._meta.refresh([topic, *many]).topics[topic].partition_count == 1  # by asking for all

"""A topic a METADATA answer lists with an error (docs/PROTOCOL.md sections 5.1 and 7).

A retriable error (LEADER_NOT_AVAILABLE for a topic just created, NODE_NOT_READY,
NOT_LEADER, ...) keeps the map the client had and is waited on within the caller's bound;
any other error reaches the caller as that error's exception. Before, every error but
LEADER_NOT_AVAILABLE on a known topic dropped it and, AUTHORIZATION_FAILED apart, was
raised as "unknown topic", a topic just created (LEADER_NOT_AVAILABLE) too. The SDK is
fed crafted answers by the fake node of tests/unit/test_sdk_hostile_answers.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fabric import errors
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from sdk import Consumer, Producer, TopicPartition
from sdk import consumer as consumer_module
from sdk._client import Bootstrap, ClusterMetadata, Connections, MetadataClient
from tests.unit.test_sdk_hostile_answers import TOPIC, FakeNode, Reply
from tests.unit.test_sdk_hostile_answers import node as node  # the fixture: a fake node per test

NONE = 0


def _topic(name: str, error: int, partitions: int = 2) -> dict[str, Any]:
    return {"error": error, "name": name, "strict_order": 0, "message_bytes_max": 0 if error else 1 << 20,
            "partitions": [] if error else [{"partition": p, "error": 0, "leader": 1, "leader_epoch": 0,
                                             "replicas": [1], "isr": [1]} for p in range(partitions)]}


class Listed:
    """A METADATA handler: the topics of the next answer, by name, with their error (0:
    listed with two partitions); names left out are not listed."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.topics: dict[str, int] = {}
        node.handlers[ApiKey.METADATA] = self

    def __call__(self, request: apis.Message) -> list[Reply]:
        body = self.node.sane(request)
        body["topics"] = [_topic(name, code) for name, code in self.topics.items()]
        return [self.node.answer(request, body)]


@pytest.fixture
def client(node: FakeNode) -> Iterator[MetadataClient]:
    conns = Connections(security=None)
    try:
        yield MetadataClient(Bootstrap(node.address), conns)
    finally:
        conns.close()


def _read(client: MetadataClient, listed: Listed, **topics: int) -> None:
    listed.topics = {TOPIC if name == "t" else name: code for name, code in topics.items()}
    client.refresh(sorted(listed.topics) or [TOPIC])


# -- the map ------------------------------------------------------------------------------------
@pytest.mark.parametrize("error", [errors.LeaderNotAvailableError, errors.NodeNotReadyError, errors.NotLeaderError])
def test_a_retriable_error_keeps_the_known_map_and_is_that_error_without_one(
        node: FakeNode, client: MetadataClient, error: type[errors.FabricError]) -> None:
    listed = Listed(node)
    _read(client, listed, t=NONE)
    _read(client, listed, t=error.code)
    assert client.topic(TOPIC, refresh_if_missing=False).partition_count == 2  # NODE_NOT_READY dropped it

    client.metadata = ClusterMetadata()
    _read(client, listed, t=error.code)
    with pytest.raises(error, match=TOPIC):  # was UnknownTopicOrPartitionError
        client.topic(TOPIC, refresh_if_missing=False)


@pytest.mark.parametrize(("code", "error", "text"), [
    (errors.UnknownTopicOrPartitionError.code, errors.UnknownTopicOrPartitionError, f"unknown topic '{TOPIC}'"),
    (errors.AuthorizationFailedError.code, errors.AuthorizationFailedError, f"may not describe topic '{TOPIC}'"),
    (errors.InvalidTopicError.code, errors.InvalidTopicError, "INVALID_TOPIC"),
    (errors.UnknownServerError.code, errors.UnknownServerError, "UNKNOWN_SERVER_ERROR"),
    (999, errors.UnknownServerError, "error code 999"),  # a code this client does not know
])
def test_a_topic_listed_with_another_error_is_forgotten_and_raises_it(
        node: FakeNode, client: MetadataClient, code: int, error: type[errors.FabricError], text: str) -> None:
    listed = Listed(node)
    _read(client, listed, t=NONE, other=NONE)
    _read(client, listed, t=code, other=NONE)
    assert TOPIC not in client.metadata.topics and "other" in client.metadata.topics
    with pytest.raises(error, match=text) as caught:
        client.topic(TOPIC, refresh_if_missing=False)
    assert type(caught.value) is error
    assert client.denied == ({TOPIC} if error is errors.AuthorizationFailedError else set())
    # Listed again without an error, or not listed at all: its error is gone.
    _read(client, listed, t=NONE)
    assert client.topic(TOPIC, refresh_if_missing=False).partition_count == 2 and not client.denied
    _read(client, listed, t=code)
    _read(client, listed)
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="unknown topic"):
        client.topic(TOPIC, refresh_if_missing=False)


# -- through the producer and the consumer -----------------------------------------------------
class Answers:
    """METADATA answers for TOPIC: each code in turn (the last one for ever), 0 the sane one."""

    def __init__(self, node: FakeNode, *codes: int) -> None:
        self.node, self.codes, self.asked = node, list(codes), 0
        node.handlers[ApiKey.METADATA] = self
        node.handlers[ApiKey.FETCH] = lambda r: []  # no answer: the consumer's fetches wait

    def __call__(self, request: apis.Message) -> list[Reply]:
        body = self.node.sane(request)
        code = self.codes[min(self.asked, len(self.codes) - 1)]
        self.asked += 1
        if code:
            body["topics"] = [_topic(t["name"], code) if t["name"] == TOPIC else t for t in body["topics"]]
        return [self.node.answer(request, body)]


def _producer(node: FakeNode, max_block_ms: int = 2_000) -> Producer:
    return Producer(node.address, acks=1, linger_ms=0, max_block_ms=max_block_ms, request_timeout_ms=1000,
                    delivery_timeout_ms=2000, retry_backoff_ms=20)


@pytest.mark.parametrize(("code", "error"), [
    (errors.UnknownTopicOrPartitionError.code, errors.UnknownTopicOrPartitionError),
    (errors.AuthorizationFailedError.code, errors.AuthorizationFailedError),
    (errors.InvalidTopicError.code, errors.InvalidTopicError),
])
def test_send_raises_the_topics_own_error_at_once(node: FakeNode, code: int, error: type[errors.FabricError]) -> None:
    Answers(node, code)
    producer = _producer(node)
    try:
        started = time.monotonic()
        with pytest.raises(error, match=TOPIC) as caught:
            producer.send(TOPIC, b"v")
        assert type(caught.value) is error and time.monotonic() - started < 1  # not max_block_ms
        with pytest.raises(error):
            producer.partitions_for(TOPIC)
    finally:
        producer.close(timeout=5)


def test_send_waits_for_a_topic_just_created(node: FakeNode) -> None:
    """LEADER_NOT_AVAILABLE, then NODE_NOT_READY, then the map: the record goes."""
    answers = Answers(node, errors.LeaderNotAvailableError.code, errors.NodeNotReadyError.code, NONE)
    producer = _producer(node)
    try:
        assert producer.send(TOPIC, b"v", partition=1).result(timeout=10).offset == 7
        assert answers.asked >= 3
    finally:
        producer.close(timeout=5)


def test_send_waits_on_a_retriable_error_for_max_block_ms_only(node: FakeNode) -> None:
    answers = Answers(node, errors.NodeNotReadyError.code)
    producer = _producer(node, max_block_ms=400)
    try:
        started = time.monotonic()
        with pytest.raises(errors.RequestTimedOutError, match="NODE_NOT_READY"):
            producer.send(TOPIC, b"v")
        assert 0.35 < time.monotonic() - started < 2
        asked = answers.asked
        assert 3 <= asked < 100  # asked again after each backoff, not in a busy loop
        time.sleep(0.2)
        assert answers.asked <= asked + 1  # and no more once nobody waits
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize(("code", "error"), [
    (errors.UnknownTopicOrPartitionError.code, errors.UnknownTopicOrPartitionError),
    (errors.AuthorizationFailedError.code, errors.AuthorizationFailedError),
    (errors.InvalidTopicError.code, errors.InvalidTopicError),
])
def test_assign_raises_the_topics_own_error_at_once(node: FakeNode, code: int, error: type[errors.FabricError]) -> None:
    Answers(node, code)
    with Consumer(node.address, request_timeout_ms=1000) as consumer:
        started = time.monotonic()
        with pytest.raises(error, match=TOPIC) as caught:
            consumer.assign([TopicPartition(TOPIC, 0)])
        with pytest.raises(error, match=TOPIC):
            consumer.subscribe_all_partitions(TOPIC)
        assert type(caught.value) is error and time.monotonic() - started < 1


def test_assign_waits_for_a_topic_just_created(node: FakeNode) -> None:
    Answers(node, errors.LeaderNotAvailableError.code, errors.LeaderNotAvailableError.code, NONE)
    with Consumer(node.address, request_timeout_ms=1000) as consumer:
        consumer.assign([TopicPartition(TOPIC, 1)])  # was UnknownTopicOrPartitionError
        assert consumer.assignment() == [TopicPartition(TOPIC, 1)]
    Answers(node, errors.NodeNotReadyError.code, NONE)
    with Consumer(node.address, request_timeout_ms=1000) as consumer:
        assert consumer.subscribe_all_partitions(TOPIC) == [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]


def test_assign_waits_on_a_retriable_error_within_its_bound(node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_module, "PARTITION_LEARN_WAIT_MS", 300)
    Answers(node, errors.NodeNotReadyError.code)
    with Consumer(node.address, request_timeout_ms=1000) as consumer:
        started = time.monotonic()
        with pytest.raises(errors.NodeNotReadyError, match=TOPIC):
            consumer.assign([TopicPartition(TOPIC, 0)])
        assert 0.2 < time.monotonic() - started < 2


def test_poll_raises_an_assigned_topics_refusal_and_waits_on_unknown(node: FakeNode) -> None:
    """The principal may no longer describe an assigned topic: poll() says so (it waited
    for ever, reading nothing); a topic the node calls unknown (being learned, or deleted)
    is waited on, as a FETCH answer's UNKNOWN_TOPIC_OR_PARTITION is."""
    answers = Answers(node, NONE)
    with Consumer(node.address, request_timeout_ms=1000) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        answers.codes = [errors.UnknownTopicOrPartitionError.code]
        assert consumer.poll(timeout_ms=100) == []
        answers.codes = [errors.AuthorizationFailedError.code]  # the map, lacking the topic, is read at each poll
        with pytest.raises(errors.AuthorizationFailedError, match=TOPIC):
            consumer.poll(timeout_ms=500)
        answers.codes = [NONE]
        assert consumer.poll(timeout_ms=50) == []  # listed again: read on

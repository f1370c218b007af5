"""The Python SDK against hostile but well-encoded answers from a node.

A ROUTER socket in a thread plays one node and answers with Fabric's own codecs (as
tests/interop/test_c_fake_node.py does for the C client); each test scripts the one answer
that a buggy, compromised or version-skewed node could give. The property: every public
call returns something consistent or raises a FabricError (never KeyError, IndexError,
ValueError, ZeroDivisionError or ZMQError), and a producer's sender thread survives.
Found by a structure-aware fuzzer of the SDK (answers mutated field by field, edges of
each type, rows dropped, duplicated or renamed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from fabric import errors
from fabric.limits import PARTITIONS_MAX
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol import queues as qp
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import encode_header
from fabric.transport import Connections
from sdk import Admin, Consumer, ConsumerRebalanceListener, Producer, QueueConsumer, TopicPartition

Reply = list[Any]
Handler = Callable[[apis.Message], list[Reply]]
TOPIC = "t0"


class FakeNode:
    """One node: sane answers for every API the tests use, unless ``handlers`` has one."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.handlers: dict[int, Handler] = {}
        self.requests: dict[int, int] = {}
        self.node_address = self.address  # the address the metadata lists for node 1
        self.partitions: list[int] = [0, 1]  # the partition numbers the metadata lists for TOPIC
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.router.close(linger=0)
        self.ctx.term()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(20):
                continue
            envelope, *message = self.router.recv_multipart()
            request = apis.decode_request(message)
            key = request.header.api_key
            self.requests[key] = self.requests.get(key, 0) + 1
            handler = self.handlers.get(key)
            for reply in handler(request) if handler is not None else [self.answer(request, self.sane(request))]:
                self.router.send_multipart([envelope, *reply])

    @staticmethod
    def answer(request: apis.Message, body: dict[str, Any]) -> Reply:
        return apis.encode_response(request.header, body)

    def sane(self, request: apis.Message) -> dict[str, Any]:
        key, body = request.header.api_key, request.body
        now_ms = int(time.time() * 1000)
        if key == ApiKey.METADATA:
            return {"controller_id": 1, "nodes": [{"node_id": 1, "address": self.node_address}],
                    "topics": [{"error": 0, "name": name, "strict_order": 0, "message_bytes_max": 1 << 20,
                                "partitions": [{"partition": p, "error": 0, "leader": 1, "leader_epoch": 0,
                                                "replicas": [1], "isr": [1]} for p in self.partitions]}
                               for name in body["topics"] or [TOPIC]]}
        if key == ApiKey.PRODUCE:
            return {"results": [{"topic": e["topic"], "partition": e["partition"], "error": 0, "base_offset": 7,
                                 "log_start_offset": 0, "message": ""} for e in body["entries"]]}
        if key == ApiKey.INIT_PRODUCER_ID:
            return {"error": 0, "producer_id": 1000, "producer_epoch": 0}
        if key == ApiKey.LIST_OFFSETS:
            return {"partitions": [{"topic": p["topic"], "partition": p["partition"], "error": 0, "timestamp": -1,
                                    "offset": 10 + p["partition"]} for p in body["partitions"]]}
        if key == ApiKey.FIND_COORDINATOR:
            return {"error": 0, "message": "", "node_id": 1, "address": self.address, "partition": 0}
        if key == ApiKey.OFFSET_FETCH:
            return {"error": 0, "message": "", "offsets": [
                {"topic": p["topic"], "partition": p["partition"], "offset": 3, "metadata": "", "commit_ms": now_ms}
                for p in body["partitions"]]}
        if key == ApiKey.DESCRIBE_GROUPS:
            return {"groups": [{"error": 0, "group_id": g, "state": "Empty", "group_epoch": 1, "members": []}
                               for g in body["group_ids"]]}
        if key == ApiKey.DELETE_GROUPS:
            return {"results": [{"group_id": g, "error": 0, "message": ""} for g in body["group_ids"]]}
        if key == ApiKey.DESCRIBE_TOPICS:
            return {"topics": [{"error": 0, "name": n, "configs": [], "partitions": []} for n in body["names"]]}
        if key == ApiKey.QUEUE_RECEIVE:
            out: dict[str, Any] = {"error": 0, "message": "", "messages": [
                {"partition": 0, "offset": 5, "delivery_count": 1, "deadline_ms": now_ms + 30_000,
                 "timestamp_ms": now_ms, "priority": 4, "key": None, "value": b"v", "headers": []}]}
            if request.header.api_version >= 1:
                out["now_ms"] = now_ms
            return out
        if key == ApiKey.QUEUE_SETTLE:
            return {"error": 0, "message": "", "results": [
                {"partition": e["partition"], "offset": e["offset"], "error": 0, "deadline_ms": now_ms}
                for e in body["entries"]]}
        raise AssertionError(f"no sane answer for {ApiKey(key).name}")


@pytest.fixture
def node() -> Iterator[FakeNode]:
    fake = FakeNode()
    try:
        yield fake
    finally:
        fake.close()


def sender_alive(producer: Producer) -> bool:
    return bool(producer._core._thread.is_alive())


# -- addresses from the network -----------------------------------------------------------------
def test_an_address_zeromq_cannot_parse_is_a_node_not_ready_and_leaks_nothing() -> None:
    conns = Connections(security=None)
    try:
        for address in ("garbage", "udp://1.2.3.4:5", "tcp://"):
            with pytest.raises(errors.NodeNotReadyError) as caught:
                conns.request(address, ApiKey.METADATA, {"topics": []}, timeout_ms=100)
            assert caught.value.fields["sent"] is False
        assert not conns.sockets and not conns._monitors  # nothing left open per attempt
    finally:
        conns.close()


def test_a_garbage_leader_address_fails_records_cleanly_and_the_producer_recovers(node: FakeNode) -> None:
    node.node_address = "garbage"  # the metadata's node list: libzmq refuses it at connect
    producer = Producer(node.address, acks=1, linger_ms=0, request_timeout_ms=1000, delivery_timeout_ms=1500,
                        max_block_ms=3000, retry_backoff_ms=20)
    try:
        future = producer.send(TOPIC, b"v", partition=0)
        with pytest.raises(errors.FabricError):  # was the sender thread dying on a ZMQError
            future.result(timeout=10)
        assert sender_alive(producer)
        node.node_address = node.address  # the node is sane again: the producer works again
        assert producer.send(TOPIC, b"w", partition=0).result(timeout=10).offset == 7
    finally:
        producer.close(timeout=5)


def test_a_garbage_coordinator_address_is_a_fabric_error(node: FakeNode) -> None:
    node.handlers[ApiKey.FIND_COORDINATOR] = lambda r: [node.answer(r, {
        "error": 0, "message": "", "node_id": 1, "address": "inproc://", "partition": 0})]
    consumer = Consumer(node.address, group_id="g1", request_timeout_ms=1000)
    try:
        with pytest.raises(errors.FabricError):  # was a bare ZMQError
            consumer.committed(TopicPartition(TOPIC, 0))
    finally:
        consumer.close()


# -- metadata --------------------------------------------------------------------------------------
@pytest.mark.parametrize("partitions", [[], [0, 0], [1], [1, 0]])
def test_a_topic_listed_without_usable_partitions_is_not_used(node: FakeNode, partitions: list[int]) -> None:
    node.partitions = partitions
    producer = Producer(node.address, acks=1, max_block_ms=500, request_timeout_ms=1000, delivery_timeout_ms=1000)
    try:
        # Was a ZeroDivisionError from the partitioner (no partition), or a partition count
        # that routed records to the wrong leaders (duplicates, gaps, out of order).
        with pytest.raises(errors.FabricError):
            producer.send(TOPIC, b"v")
        with pytest.raises(errors.FabricError):
            producer.send(TOPIC, b"v", key=b"k")
        assert sender_alive(producer)
    finally:
        producer.close(timeout=5)


def test_a_negative_partition_from_a_node_has_no_leader(node: FakeNode) -> None:
    node.handlers[ApiKey.OFFSET_FETCH] = lambda r: [node.answer(r, {"error": 0, "message": "", "offsets": [
        {"topic": TOPIC, "partition": -5, "offset": 3, "metadata": "", "commit_ms": 0}]})]
    with Admin(node.address, request_timeout_ms=2000) as admin:
        described = admin.describe_group("g1")  # was an IndexError from the routing map
    assert [(o.partition, o.log_end) for o in described.offsets] == [(-5, -1)]


# -- impossible values ---------------------------------------------------------------------------
@pytest.mark.parametrize(("idempotent", "base_offset"), [
    (False, -1),  # -1 only for an idempotent retry whose first write's offset is forgotten
    (False, -7),
    (False, batch_format.OFFSET_MAX),  # two records: the second would be at 2^63
    (True, -2),
    (True, batch_format.OFFSET_MAX),
])
def test_a_produce_answers_impossible_base_offset_fails_the_batch(node: FakeNode, idempotent: bool,
                                                                   base_offset: int) -> None:
    sent: list[batch_format.BatchHeader] = []

    def produce(request: apis.Message) -> list[Reply]:
        sent.extend(batch_format.read_header(b) for b in request.batches)
        body = node.sane(request)
        if len(sent) == 1:
            body["results"][0]["base_offset"] = base_offset
        return [node.answer(request, body)]

    node.handlers[ApiKey.PRODUCE] = produce
    producer = Producer(node.address, acks="all" if idempotent else 1, enable_idempotence=idempotent, linger_ms=0,
                        request_timeout_ms=1000, delivery_timeout_ms=2000, retry_backoff_ms=20)
    try:
        first = producer.send_batch(TOPIC, [b"a", b"b"], partition=0)
        with pytest.raises(errors.UnknownServerError) as caught:  # was handed out as the records' offsets
            first.result(timeout=10)
        assert caught.value.fields["base_offset"] == base_offset
        assert sender_alive(producer)
        # Not resent (it may be stored: a resend without idempotence writes it twice), and
        # an idempotent producer's next batch starts a new epoch at sequence 0: the first
        # batch's numbers are neither reused nor left as a gap the node refuses for good.
        assert producer.send(TOPIC, b"c", partition=0).result(timeout=10).offset == 7
        assert len(sent) == 2
        if idempotent:
            assert [(h.producer_epoch, h.base_sequence) for h in sent] == [(0, 0), (1, 0)]
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize(("idempotent", "base_offset", "offsets"), [
    (True, -1, [-1, -1]),  # an idempotent retry whose first write's offset is forgotten (PROTOCOL.md 5.2)
    (False, batch_format.OFFSET_MAX - 1, [batch_format.OFFSET_MAX - 1, batch_format.OFFSET_MAX]),
])
def test_possible_base_offsets_are_still_taken(node: FakeNode, idempotent: bool, base_offset: int,
                                               offsets: list[int]) -> None:
    node.handlers[ApiKey.PRODUCE] = lambda r: [node.answer(r, {"results": [
        {**e, "base_offset": base_offset} for e in node.sane(r)["results"]]})]
    producer = Producer(node.address, acks="all" if idempotent else 1, enable_idempotence=idempotent, linger_ms=5,
                        request_timeout_ms=1000, delivery_timeout_ms=2000)
    try:
        futures = [producer.send(TOPIC, v, partition=0) for v in (b"a", b"b")]
        assert [f.result(timeout=10).offset for f in futures] == offsets
    finally:
        producer.close(timeout=5)


@pytest.mark.parametrize("epoch", [-1, -2, -9, 0])
def test_a_heartbeat_answers_impossible_member_epoch_is_refused_not_echoed(node: FakeNode, epoch: int) -> None:
    epochs_sent: list[int] = []

    def heartbeat(request: apis.Message) -> list[Reply]:
        epochs_sent.append(request.body["member_epoch"])
        answer = {"error": 0, "message": "", "member_id": "m1", "member_epoch": 5 if len(epochs_sent) != 2 else epoch,
                  "heartbeat_interval_ms": 0, "assignment": []}
        return [node.answer(request, answer)]

    node.handlers[ApiKey.CONSUMER_GROUP_HEARTBEAT] = heartbeat
    consumer = Consumer(node.address, group_id="g1", request_timeout_ms=1000)
    try:
        consumer.subscribe([TOPIC])  # joins: epoch 5
        with pytest.raises(errors.UnknownServerError) as caught:  # -1 was stored, and the next heartbeat left
            consumer.poll(timeout_ms=0)
        assert caught.value.fields["member_epoch"] == epoch
        time.sleep(0.15)  # the heartbeat after a bad answer waits COORDINATOR_RETRY_MS
        consumer.poll(timeout_ms=0)
        assert epochs_sent == [0, 5, 5]
    finally:
        consumer.close()


HELD = [{"topic": TOPIC, "partitions": [0]}]  # what a sane coordinator gives the member below


@pytest.mark.parametrize(("pattern", "bad"), [
    (None, {"member_id": ""}),  # echoed, the next heartbeat was UNKNOWN_MEMBER_ID: partitions lost, a rejoin
    (None, {"member_id": "m" * 201}),  # above MEMBER_ID_BYTES_MAX: in every later request
    (None, {"member_id": "m2"}),  # a member in the group renamed: its next heartbeat and commits under another's id
    (None, {"assignment": [{"topic": TOPIC, "partitions": [-1]}]}),  # was taken: assigned, without a leader
    (None, {"assignment": [{"topic": TOPIC, "partitions": [1, 1]}]}),
    (None, {"assignment": [{"topic": TOPIC, "partitions": [0]}, {"topic": TOPIC, "partitions": [1]}]}),
    (None, {"assignment": [{"topic": TOPIC, "partitions": [PARTITIONS_MAX]}]}),  # no topic has it, ever
    (None, {"assignment": [{"topic": "other", "partitions": [0]}]}),  # not subscribed: was read
    (r"t\d", {"assignment": [{"topic": "x1", "partitions": [0]}]}),  # the pattern does not match it
    (".*", {"assignment": [{"topic": "__consumer_offsets", "partitions": [0]}]}),  # a pattern never matches __*
])
def test_a_malformed_group_heartbeat_answer_is_refused_and_nothing_of_it_taken(
        node: FakeNode, pattern: str | None, bad: dict[str, Any]) -> None:
    """As an impossible epoch: the poll that sent the heartbeat raises, the member keeps
    its id, epoch and partitions, and finds the coordinator again before its next one."""
    sent: list[dict[str, Any]] = []

    def heartbeat(request: apis.Message) -> list[Reply]:
        sent.append(request.body)
        answer = {"error": 0, "message": "", "member_id": "m1", "member_epoch": 5, "heartbeat_interval_ms": 0,
                  "assignment": HELD}
        if len(sent) == 2:
            answer.update(member_epoch=6, **bad)
        return [node.answer(request, answer)]

    node.handlers[ApiKey.CONSUMER_GROUP_HEARTBEAT] = heartbeat
    node.handlers[ApiKey.FETCH] = lambda r: []  # never answered: the member's reads are not what is tested
    consumer = Consumer(node.address, group_id="g1", request_timeout_ms=1000, enable_auto_commit=False)
    try:
        consumer.subscribe(None if pattern else [TOPIC], pattern=pattern)
        assert consumer.assignment() == [TopicPartition(TOPIC, 0)]
        found = node.requests[ApiKey.FIND_COORDINATOR]
        with pytest.raises(errors.UnknownServerError) as caught:
            consumer.poll(timeout_ms=0)
        assert caught.value.fields["member_epoch"] == 6
        assert consumer.assignment() == [TopicPartition(TOPIC, 0)]
        time.sleep(0.12)  # the heartbeat after a bad answer waits COORDINATOR_RETRY_MS
        consumer.poll(timeout_ms=0)
        assert [(b["member_id"], b["member_epoch"], b["owned"]) for b in sent] == [
            ("", 0, []), ("m1", 5, HELD), ("m1", 5, HELD)]
        assert node.requests[ApiKey.FIND_COORDINATOR] == found + 1
    finally:
        consumer.close()


class Assignments(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[TopicPartition]]] = []

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.calls.append(("assigned", assigned))

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.calls.append(("revoked", revoked))


def _poll_until(consumer: Consumer, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 2
    while not done():
        assert time.monotonic() < deadline
        consumer.poll(timeout_ms=20)


def test_group_partitions_the_map_does_not_list_yet_wait_until_it_does(node: FakeNode) -> None:
    """A topic just grown: the coordinator's map has partition 2 before the node the member
    asks does. It is kept pending (Kafka's unresolved partitions), the rest is taken at
    once. Before, the member waited PARTITION_LEARN_WAIT_MS for it, inside the heartbeat,
    then took none of the answer (partition 0 neither) and did it all again."""
    sent: list[dict[str, Any]] = []
    assignment = [{"topic": TOPIC, "partitions": [0, 2]}]

    def heartbeat(request: apis.Message) -> list[Reply]:
        sent.append(request.body)
        return [node.answer(request, {"error": 0, "message": "", "member_id": "m1", "member_epoch": 5,
                                      "heartbeat_interval_ms": 3_000, "assignment": assignment})]

    node.handlers[ApiKey.CONSUMER_GROUP_HEARTBEAT] = heartbeat
    node.handlers[ApiKey.FETCH] = lambda r: []
    listener = Assignments()
    consumer = Consumer(node.address, group_id="g1", request_timeout_ms=1000, enable_auto_commit=False)
    try:
        started = time.monotonic()
        consumer.subscribe([TOPIC], listener=listener)
        assert time.monotonic() - started < 1
        assert consumer.assignment() == [TopicPartition(TOPIC, 0)]
        consumer.poll(timeout_ms=0)  # the map is read again: still two partitions
        assert consumer.assignment() == [TopicPartition(TOPIC, 0)]
        assert consumer._group is not None and consumer._group.pending == {TopicPartition(TOPIC, 2)}
        node.partitions = [0, 1, 2]
        _poll_until(consumer, lambda: len(consumer.assignment()) == 2)
        assert listener.calls == [("assigned", [TopicPartition(TOPIC, 0)]), ("assigned", [TopicPartition(TOPIC, 2)])]
        assert len(sent) == 2  # the interval is 3 s: the map listing it made the heartbeat that took it
    finally:
        consumer.close()


def test_a_group_pattern_topic_the_map_does_not_list_yet_waits_and_can_be_taken_back(node: FakeNode) -> None:
    """A pattern's new topic waits for the map too; the coordinator may take a pending
    partition back (never given to the application: no callback), or give nothing."""
    known = {TOPIC}
    assignments = [[{"topic": TOPIC, "partitions": [0]}, {"topic": "t1", "partitions": [0]}]]

    def metadata(request: apis.Message) -> list[Reply]:
        body = node.sane(request)
        body["topics"] = [t for t in body["topics"] if t["name"] in known]
        return [node.answer(request, body)]

    def heartbeat(request: apis.Message) -> list[Reply]:
        return [node.answer(request, {"error": 0, "message": "", "member_id": "m1", "member_epoch": 5,
                                      "heartbeat_interval_ms": 20, "assignment": assignments[-1]})]

    node.handlers[ApiKey.METADATA] = metadata
    node.handlers[ApiKey.CONSUMER_GROUP_HEARTBEAT] = heartbeat
    node.handlers[ApiKey.FETCH] = lambda r: []
    listener = Assignments()
    consumer = Consumer(node.address, group_id="g1", request_timeout_ms=1000, enable_auto_commit=False)
    t0, t1 = TopicPartition(TOPIC, 0), TopicPartition("t1", 0)
    try:
        consumer.subscribe(pattern=r"t\d", listener=listener)
        consumer.poll(timeout_ms=0)
        assert consumer.assignment() == [t0]
        assert consumer._group is not None and consumer._group.pending == {t1}
        assignments.append([{"topic": TOPIC, "partitions": [0]}])  # taken back before the map listed it
        known.add("t1")
        consumer.poll(timeout_ms=50)
        assert consumer.assignment() == [t0]
        assert not consumer._group.pending
        assignments.append([{"topic": TOPIC, "partitions": [0]}, {"topic": "t1", "partitions": [0]}])
        _poll_until(consumer, lambda: len(consumer.assignment()) == 2)
        assignments.append([])  # an empty assignment: everything revoked
        _poll_until(consumer, lambda: not consumer.assignment())
        assert listener.calls == [("assigned", [t0]), ("assigned", [t1]), ("revoked", [t0, t1])]
    finally:
        consumer.close()


# -- answers that do not match the request ------------------------------------------------------
def test_list_offsets_rows_are_matched_by_partition(node: FakeNode) -> None:
    tps = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    sane = node.sane
    node.handlers[ApiKey.LIST_OFFSETS] = lambda r: [node.answer(r, {"partitions": sane(r)["partitions"][::-1]})]
    consumer = Consumer(node.address, request_timeout_ms=1000)
    try:
        assert consumer.end_offsets(tps) == {tps[0]: 10, tps[1]: 11}  # were swapped
        node.handlers[ApiKey.LIST_OFFSETS] = lambda r: [node.answer(r, {"partitions": sane(r)["partitions"][:1]})]
        with pytest.raises(errors.UnknownServerError):  # was a ValueError from zip(strict=True)
            consumer.end_offsets(tps)
        with Admin(node.address, request_timeout_ms=2000) as admin:  # a partition left out: -1, as refused
            assert admin.reset_offsets("g1", TOPIC, to="latest", partitions=[0, 1], dry_run=True) == {
                tps[0]: 10, tps[1]: -1}
    finally:
        consumer.close()


def test_a_negative_log_end_is_refused_not_made_a_position(node: FakeNode) -> None:
    node.handlers[ApiKey.LIST_OFFSETS] = lambda r: [node.answer(r, {"partitions": [
        {**p, "offset": -7} for p in node.sane(r)["partitions"]]})]
    consumer = Consumer(node.address, request_timeout_ms=1000)
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        with pytest.raises(errors.UnknownServerError):  # was a ValueError from seek()'s argument check
            consumer.seek_to_end()
    finally:
        consumer.close()


def test_describe_answers_without_the_row_asked_for(node: FakeNode) -> None:
    node.handlers[ApiKey.DESCRIBE_TOPICS] = lambda r: [node.answer(r, {"topics": [
        {"error": 0, "name": "other", "configs": [], "partitions": []}]})]
    node.handlers[ApiKey.DESCRIBE_GROUPS] = lambda r: [node.answer(r, {"groups": []})]
    node.handlers[ApiKey.DELETE_GROUPS] = lambda r: [node.answer(r, {"results": []})]
    with Admin(node.address, request_timeout_ms=2000) as admin:
        for call in (lambda: admin.describe_topic(TOPIC), lambda: admin.describe_queue(TOPIC),
                     lambda: admin.describe_group("g1"), lambda: admin.delete_group("g1")):
            with pytest.raises(errors.UnknownServerError):  # were IndexError, or another topic described
                call()


def test_settle_results_for_positions_not_asked(node: FakeNode) -> None:
    node.handlers[ApiKey.QUEUE_SETTLE] = lambda r: [node.answer(r, {"error": 0, "message": "", "results": [
        {"partition": 1, "offset": 99, "error": 0, "deadline_ms": 0}]})]
    queue = QueueConsumer(node.address, TOPIC)
    try:
        [message] = queue.receive(1, wait_ms=0)
        with pytest.raises(errors.LeaseNotHeldError) as caught:  # was a KeyError
            queue.ack(message)
        assert caught.value.fields["lost"] == [message]  # left out of the answer: not known to be acked
        assert caught.value.fields["unknown"] == [message]
    finally:
        queue.close()


# -- another API's answer with a request's correlation id ---------------------------------------
def test_another_apis_answer_does_not_kill_the_producer_sender(node: FakeNode) -> None:
    first = [True]

    def produce(request: apis.Message) -> list[Reply]:
        if first[0]:
            first[0] = False
            metadata = apis.Message(request.header._replace(api_key=ApiKey.METADATA, api_version=0), {"topics": []}, [])
            return [node.answer(metadata, node.sane(metadata))]  # a METADATA answer with the PRODUCE's id
        return [node.answer(request, node.sane(request))]

    node.handlers[ApiKey.PRODUCE] = produce
    producer = Producer(node.address, acks=1, linger_ms=0, request_timeout_ms=1000, delivery_timeout_ms=6000)
    try:
        # Was a KeyError in the sender thread: it died and failed this and every later record.
        assert producer.send(TOPIC, b"v", partition=0).result(timeout=10).offset == 7  # resent after the timeout
        assert sender_alive(producer)
    finally:
        producer.close(timeout=5)


def test_another_apis_answer_is_not_taken_for_a_synchronous_request(node: FakeNode) -> None:
    def list_offsets(request: apis.Message) -> list[Reply]:
        metadata = apis.Message(request.header._replace(api_key=ApiKey.METADATA, api_version=0), {"topics": []}, [])
        return [node.answer(metadata, node.sane(metadata)), node.answer(request, node.sane(request))]

    node.handlers[ApiKey.LIST_OFFSETS] = list_offsets
    consumer = Consumer(node.address, request_timeout_ms=2000)
    try:
        tp = TopicPartition(TOPIC, 1)
        assert consumer.end_offsets([tp]) == {tp: 11}  # was a KeyError from the METADATA body
    finally:
        consumer.close()


def test_another_apis_answer_is_not_taken_for_a_queue_poll(node: FakeNode) -> None:
    def receive(request: apis.Message) -> list[Reply]:
        metadata = apis.Message(request.header._replace(api_key=ApiKey.METADATA, api_version=0), {"topics": []}, [])
        return [node.answer(metadata, node.sane(metadata)), node.answer(request, node.sane(request))]

    node.handlers[ApiKey.QUEUE_RECEIVE] = receive
    queue = QueueConsumer(node.address, TOPIC)
    try:
        [message] = queue.receive(qp.RECEIVE_MESSAGES_MAX, wait_ms=0)  # was a KeyError
        assert (message.partition, message.offset) == (0, 5)
    finally:
        queue.close()


# -- a message with a request's correlation id but no response flag -------------------------------
def _unflagged(request: apis.Message, reply: Reply) -> Reply:
    """``reply`` with the response flag cleared: a request-shaped message, the answer's body."""
    return [encode_header(request.header._replace(flags=0)), *reply[1:]]


def test_a_message_without_the_response_flag_is_not_taken_for_an_answer(node: FakeNode) -> None:
    """An answer body sent without flags bit 0 (a request, or a peer's mistake) carrying a
    request's correlation id and API was read as the answer: here an end offset of 999.
    It is dropped, as another request's answer is, and the real answer is waited for."""
    def list_offsets(request: apis.Message) -> list[Reply]:
        forged = node.sane(request)
        forged["partitions"][0]["offset"] = 999
        return [_unflagged(request, node.answer(request, forged)), node.answer(request, node.sane(request))]

    node.handlers[ApiKey.LIST_OFFSETS] = list_offsets
    consumer = Consumer(node.address, request_timeout_ms=2000)
    try:
        tp = TopicPartition(TOPIC, 1)
        assert consumer.end_offsets([tp]) == {tp: 11}
    finally:
        consumer.close()


def test_a_produce_answer_without_the_response_flag_is_not_taken(node: FakeNode) -> None:
    def produce(request: apis.Message) -> list[Reply]:
        forged = node.sane(request)
        forged["results"][0]["base_offset"] = 999
        return [_unflagged(request, node.answer(request, forged)), node.answer(request, node.sane(request))]

    node.handlers[ApiKey.PRODUCE] = produce
    producer = Producer(node.address, acks=1, linger_ms=0, request_timeout_ms=1000, delivery_timeout_ms=6000)
    try:
        assert producer.send(TOPIC, b"v", partition=0).result(timeout=10).offset == 7
        assert sender_alive(producer)
    finally:
        producer.close(timeout=5)


def test_an_assigned_topic_this_principal_may_not_describe_is_an_authorization_error(node: FakeNode) -> None:
    """A topic named in subscribe() that the principal may not describe (a secure cluster):
    the coordinator assigns it (a named topic stays), METADATA refuses it. It waited
    pending for ever, re-read every 250 ms; poll() now raises AuthorizationFailedError each
    time the map is read again, as Kafka's TopicAuthorizationException, after the heartbeat
    (the membership holds) and while the other partitions are read."""
    secret = "secret-topic"

    def metadata(request: apis.Message) -> list[Reply]:
        body = node.sane(request)
        for topic in body["topics"]:
            if topic["name"] == secret:
                topic.update(error=errors.AuthorizationFailedError.code, partitions=[])
        return [node.answer(request, body)]

    def heartbeat(request: apis.Message) -> list[Reply]:
        return [node.answer(request, {"error": 0, "message": "", "member_id": "m1", "member_epoch": 5,
                                      "heartbeat_interval_ms": 3_000,
                                      "assignment": [{"topic": TOPIC, "partitions": [0]},
                                                     {"topic": secret, "partitions": [0]}]})]

    node.handlers[ApiKey.METADATA] = metadata
    node.handlers[ApiKey.CONSUMER_GROUP_HEARTBEAT] = heartbeat
    node.handlers[ApiKey.FETCH] = lambda r: []
    consumer = Consumer(node.address, group_id="g1", request_timeout_ms=1000, enable_auto_commit=False)
    try:
        consumer.subscribe([TOPIC, secret])
        assert consumer.assignment() == [TopicPartition(TOPIC, 0)]
        deadline = time.monotonic() + 2
        with pytest.raises(errors.AuthorizationFailedError, match=secret):
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=50)
        consumer.poll(timeout_ms=0)  # raised once per re-read of the map, not at every poll
        assert consumer.assignment() == [TopicPartition(TOPIC, 0)]
    finally:
        consumer.close()

"""The C client against a scripted node: retries, and hostile answers from the network.

A ROUTER socket in a thread plays one node and answers with Fabric's own Python codecs,
so each test decides exactly what the C client sees: NOT_LEADER on the first PRODUCE
(the client must refresh METADATA, back off and resend the same batch bytes), or a FETCH
answer carrying a corrupt batch or an lz4 bomb (the client must refuse it cleanly).
"""

from __future__ import annotations

import resource
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq

from fabric import errors
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol.apis import ApiKey
from tests.interop.conftest import CClient

pytestmark = pytest.mark.interop

TOPIC = "scripted"
PROCESS_TIMEOUT_S = 60.0

Handler = Callable[[apis.Message], list[Any] | None]


@dataclass
class FakeNode:
    address: str
    produce_batches: list[list[bytes]] = field(default_factory=list)
    metadata_requests: int = 0
    fetch_requests: int = 0
    fetch_orders: list[list[int]] = field(default_factory=list)  # each FETCH's partitions, in request order
    partitions: int = 1  # the topic's partition count in the metadata this node gives
    answered_with_next_waiting: int = 0  # PRODUCE answers sent while another request already waited
    # The body of the n-th METADATA answer (n from 1), when a test scripts it; else metadata_body.
    metadata: Callable[[int], dict[str, Any]] | None = None
    # Messages sent just before the answer to a request (hostile ones, not the answer), when scripted.
    before_answer: Callable[[apis.Message], list[list[Any]]] | None = None
    # Every address the node listens on: the first is `address`, the others more ports of it
    # (a fake_node parametrized indirectly with a port count), for a node that moves.
    addresses: list[str] = field(default_factory=list)
    # For a request whose answer is to be held back, the condition under which it goes out
    # (checked before each message is read, and every 50 ms), when scripted: a node slow to
    # answer one request while it answers the others. None for a request: answered at once.
    hold_answer: Callable[[apis.Message], Callable[[], bool] | None] | None = None
    # For a request the node takes and then drops its connections over, unanswered, when
    # scripted: it closes its socket (as a node that dies: the kernel closes a killed
    # process's connections at once) and binds again at the same addresses (restarted there).
    drop_after: Callable[[apis.Message], bool] | None = None


def metadata_body(address: str, partitions: int = 1) -> dict[str, Any]:
    return {
        "controller_id": 1,
        "nodes": [{"node_id": 1, "address": address}],
        "topics": [{"error": 0, "name": TOPIC, "strict_order": 0, "message_bytes_max": 8 << 20,
                    "partitions": [{"partition": p, "error": 0, "leader": 1, "leader_epoch": 0,
                                    "replicas": [1], "isr": [1]} for p in range(partitions)]}],
    }


@pytest.fixture
def fake_node(request: pytest.FixtureRequest) -> Iterator[tuple[FakeNode, Callable[[Handler], None]]]:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    # Bound here, before the serving thread starts: a ZeroMQ socket is not to be shared by threads.
    ports = [router.bind_to_random_port("tcp://127.0.0.1") for _ in range(getattr(request, "param", 1))]
    node = FakeNode(f"tcp://127.0.0.1:{ports[0]}", addresses=[f"tcp://127.0.0.1:{port}" for port in ports])
    stop = threading.Event()
    handlers: list[Handler] = []

    def serve() -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        held: list[tuple[Callable[[], bool], list[bytes], list[Any]]] = []  # (release when, envelope, answer)
        while not stop.is_set():
            for item in [item for item in held if item[0]()]:
                held.remove(item)
                router.send_multipart(item[1] + item[2])
            if not poller.poll(50):
                continue
            frames = router.recv_multipart()
            envelope, message = frames[:1], frames[1:]
            request = apis.decode_request(message)
            if request.header.api_key == ApiKey.METADATA:
                node.metadata_requests += 1
                body = (metadata_body(node.address, node.partitions) if node.metadata is None
                        else node.metadata(node.metadata_requests))
                reply: list[Any] | None = apis.encode_response(request.header, body)
            else:
                if request.header.api_key == ApiKey.PRODUCE:
                    node.produce_batches.append([bytes(b) for b in request.batches])
                if request.header.api_key == ApiKey.FETCH:
                    node.fetch_requests += 1
                    node.fetch_orders.append([p["partition"] for p in request.body["partitions"]])
                if node.drop_after is not None and node.drop_after(request):
                    poller.unregister(router)
                    rebind()
                    poller.register(router, zmq.POLLIN)
                    continue
                reply = handlers[0](request)
                if request.header.api_key == ApiKey.PRODUCE and router.poll(0):
                    node.answered_with_next_waiting += 1
            for hostile in node.before_answer(request) if node.before_answer is not None else []:
                router.send_multipart(envelope + hostile)
            release = node.hold_answer(request) if node.hold_answer is not None else None
            if reply is not None and release is not None:
                held.append((release, envelope, reply))
            elif reply is not None:
                router.send_multipart(envelope + reply)

    def rebind() -> None:
        nonlocal router
        router.close(linger=0)
        router = ctx.socket(zmq.ROUTER)
        deadline = time.monotonic() + 5.0
        for address in node.addresses:
            while True:  # the old socket's listener closes in libzmq's I/O thread, a moment later
                try:
                    router.bind(address)
                    break
                except zmq.ZMQError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield node, handlers.append
    finally:
        stop.set()
        thread.join(5)
        router.close(linger=0)
        ctx.term()


def consume_two_offsets(c_client: CClient, address: str, *, idle_ms: int) -> list[str]:
    """fabric-consume of partition 0 from offset 0 until two records (or ``idle_ms`` with
    none): the offsets it printed; it must exit 0."""
    run = subprocess.run([str(c_client.consume), "-b", address, "-t", TOPIC, "-p", "0", "-o", "0",
                          "-c", "2", "-i", str(idle_ms), "-F", "offset"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    return run.stdout.decode().splitlines()


def produce_result(request: apis.Message, error: int, base_offset: int) -> list[Any]:
    results = [{"topic": e["topic"], "partition": e["partition"], "error": error,
                "base_offset": base_offset if error == 0 else -1, "log_start_offset": 0,
                "message": "" if error == 0 else "scripted error"} for e in request.body["entries"]]
    return apis.encode_response(request.header, {"results": results})


def test_not_leader_is_retried_with_the_same_batch_bytes(c_client: CClient, fake_node: Any) -> None:
    node, set_handler = fake_node
    answers = iter([8, 9, 0])  # NOT_LEADER, LEADER_NOT_AVAILABLE, then success
    set_handler(lambda request: produce_result(request, next(answers), 0))
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC, "-k", "\t",
                          "-H", "src=c"], input=b"k1\tv1\nk2\tv2\n\tv3\n", capture_output=True,
                         timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert len(node.produce_batches) == 3
    first = node.produce_batches[0]
    assert len(first) == 1
    assert all(attempt == first for attempt in node.produce_batches)  # same bytes every time
    assert node.metadata_requests >= 3  # the first lookup, then a refresh after each error
    decoded = batch_format.decode_batch(first[0])
    assert decoded.keys == [b"k1", b"k2", b""]
    assert decoded.values == [b"v1", b"v2", b"v3"]
    assert decoded.headers == [[("src", b"c")]] * 3
    batch_format.validate(first[0], 8 << 20)


def test_non_retriable_error_fails_the_records(c_client: CClient, fake_node: Any) -> None:
    node, set_handler = fake_node
    set_handler(lambda request: produce_result(request, 11, 0))  # MESSAGE_TOO_LARGE
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC],
                         input=b"a\nb\n", capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1
    assert b"MESSAGE_TOO_LARGE" in run.stderr
    assert b"2 failed" in run.stderr
    assert len(node.produce_batches) == 1  # not retried


def test_request_level_error_is_reported(c_client: CClient, fake_node: Any) -> None:
    node, set_handler = fake_node
    set_handler(lambda request: apis.encode_error_response(request.header, 23, "acks make no sense"))
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC],
                         input=b"a\n", capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1
    assert b"INVALID_REQUEST" in run.stderr


def good_batch(base_offset: int) -> bytes:
    return batch_format.encode_batch([1_700_000_000_000, 1_700_000_000_001], [b"k", None], [b"a", b"b"],
                                     codec=batch_format.CODEC_LZ4, base_offset=base_offset, leader_epoch=0)


def fetch_answer(request: apis.Message, batches: list[bytes]) -> list[Any]:
    p = request.body["partitions"][0]
    body = {"partitions": [{"topic": p["topic"], "partition": p["partition"], "error": 0,
                            "high_watermark": 100, "log_start_offset": 0, "log_end_offset": 100,
                            "batch_count": len(batches)}]}
    return apis.encode_response(request.header, body, batches)


def reseal(raw: bytearray) -> bytes:
    struct.pack_into("<I", raw, 16, zlib.crc32(memoryview(raw)[20:]) & 0xFFFFFFFF)
    return bytes(raw)


def lz4_bomb() -> bytes:
    """A valid batch whose lz4 frame and header both claim 64 MiB + 1 of records."""
    raw = bytearray(good_batch(2))
    claim = (64 << 20) + 1
    struct.pack_into("<i", raw, 68, claim)
    struct.pack_into("<Q", raw, 72 + 6, claim)
    return reseal(raw)


def bad_crc() -> bytes:
    raw = bytearray(good_batch(2))
    raw[-1] ^= 0xFF
    return bytes(raw)


def truncated() -> bytes:
    raw = bytearray(good_batch(2)[:-3])
    struct.pack_into("<i", raw, 8, len(raw))
    return reseal(raw)


def frame_claims_huge() -> bytes:
    """records_bytes is honest, the lz4 frame claims 64 GiB."""
    raw = bytearray(good_batch(2))
    struct.pack_into("<Q", raw, 72 + 6, 64 << 30)
    return reseal(raw)


def offsets_past_i64() -> bytes:
    """Stamped (outside the CRC) so that the second record's offset would be 2^63: the
    decoder's base_offset + i overflowed, undefined behaviour that UBSan reports."""
    return good_batch((1 << 63) - 1)


def timestamps_past_i64() -> bytes:
    """first_timestamp 2^63 - 1 and the second record's delta +1: first_timestamp + delta
    overflowed in the decoder as well."""
    raw = bytearray(good_batch(2))
    struct.pack_into("<q", raw, 28, (1 << 63) - 1)
    struct.pack_into("<q", raw, 36, (1 << 63) - 1)
    return reseal(raw)


@pytest.mark.parametrize(
    ("make_bad", "error_name"),
    [
        (bad_crc, b"CORRUPT_MESSAGE"),
        (truncated, b"CORRUPT_MESSAGE"),
        (lz4_bomb, b"DECOMPRESSION_LIMIT"),
        (frame_claims_huge, b"DECOMPRESSION_LIMIT"),
        (offsets_past_i64, b"CORRUPT_MESSAGE"),
        (timestamps_past_i64, b"CORRUPT_MESSAGE"),
    ],
)
def test_consumer_refuses_hostile_batches(c_client: CClient, fake_node: Any,
                                          make_bad: Callable[[], bytes], error_name: bytes) -> None:
    node, set_handler = fake_node
    answers = iter([[good_batch(0)], [make_bad()]])
    set_handler(lambda request: fetch_answer(request, next(answers)))
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0",
                          "-o", "0", "-F", "offset,key,value", "--hex"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1, run.stderr.decode()
    assert error_name in run.stderr
    # The good batch came out whole before the bad one was refused.
    assert run.stdout.decode().splitlines() == ["0\t6b\t61", "1\t-\t62"]


@pytest.mark.parametrize(
    ("make_bad", "error"),
    [
        (bad_crc, errors.CorruptMessageError),
        (truncated, errors.CorruptMessageError),
        (lz4_bomb, errors.DecompressionLimitError),
        (offsets_past_i64, errors.CorruptMessageError),
        (timestamps_past_i64, errors.CorruptMessageError),
    ],
)
def test_python_consumer_refuses_the_same_hostile_batches(fake_node: Any, make_bad: Callable[[], bytes],
                                                          error: type[errors.FabricError]) -> None:
    """The Python consumer, from the same scripted node: each batch refused with the same
    error, from poll(), and again on the next poll (the position stays before it). An offset
    past 2^63-1 was a raw struct.error from encoding the next FETCH, and a timestamp past
    the i64 range was handed out."""
    from sdk import Consumer, TopicPartition

    node, set_handler = fake_node
    set_handler(lambda request: fetch_answer(request, [good_batch(0)] if request.body["partitions"][0][
        "fetch_offset"] == 0 else [make_bad()]))
    tp = TopicPartition(TOPIC, 0)
    with Consumer(node.address) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        assert [r.offset for r in consumer.poll(5_000)] == [0, 1]
        for _ in range(2):
            with pytest.raises(error):
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    consumer.poll(1_000)
        assert consumer.position(tp) == 2


def test_pipelined_batches_of_one_partition_and_in_order_resends(c_client: CClient, fake_node: Any) -> None:
    """Several batches of one partition go out before the first is answered (max_in_flight
    5); after a failure they are resent in their order, the earliest first and alone."""
    node, set_handler = fake_node
    accepted: list[bytes] = []
    state = {"refuse_until": 0.0, "next_offset": 0}

    def handler(request: apis.Message) -> list[Any]:
        time.sleep(0.05)  # a slow node: a pipelining client sends its next batches meanwhile
        if not state["refuse_until"]:
            state["refuse_until"] = time.monotonic() + 0.3  # leadership moving: refuse for a while
        if time.monotonic() < state["refuse_until"]:
            return produce_result(request, 8, 0)  # NOT_LEADER for every batch
        results = []
        for entry, data in zip(request.body["entries"], request.batches, strict=True):
            results.append({"topic": entry["topic"], "partition": entry["partition"], "error": 0,
                            "base_offset": state["next_offset"], "log_start_offset": 0, "message": ""})
            state["next_offset"] += batch_format.read_header(data).record_count
            accepted.append(bytes(data))
        return apis.encode_response(request.header, {"results": results})

    set_handler(handler)
    lines = b"".join(b"value-%03d\n" % i for i in range(200))
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC, "-p", "0", "-s", "200",
                          "-l", "50"], input=lines, capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert node.answered_with_next_waiting > 0  # pipelined: sent before the previous answer came
    first = node.produce_batches[0][0]
    first_accepted = next(i for i, request in enumerate(node.produce_batches) if bytes(request[0]) == accepted[0])
    assert node.produce_batches[first_accepted] == [first]  # the earliest batch, resent alone
    values = [v for data in accepted for v in batch_format.decode_batch(data).values]
    assert values == [b"value-%03d" % i for i in range(200)]  # each once, in order


# How soon after its connection dropped a request must be sent again: generous (a METADATA
# refresh and retry_backoff_ms come first), and far below request_timeout_ms (30 s in both
# examples), which it used to wait.
RESEND_AFTER_DROP_S_MAX = 5.0


def drop_once(api_key: ApiKey, dropped_at: list[float]) -> Callable[[apis.Message], bool]:
    """A FakeNode.drop_after that drops the connections over the first request of api_key."""
    def drop(request: apis.Message) -> bool:
        if request.header.api_key != api_key or dropped_at:
            return False
        dropped_at.append(time.monotonic())
        return True
    return drop


def test_producer_resends_at_once_when_the_leaders_connection_drops(c_client: CClient, fake_node: Any) -> None:
    """The leader takes the first PRODUCE and drops its connections unanswered, then is back at
    the same address (a node killed and restarted: the kernel closes a dead process's
    connections at once). The producer sees the drop on its socket's monitor and resends what
    was in flight there within seconds, the same batch bytes in their order (three batches
    of one partition, pipelined), each stored once; it used to wait request_timeout_ms (30 s)."""
    node, set_handler = fake_node
    dropped_at: list[float] = []
    node.drop_after = drop_once(ApiKey.PRODUCE, dropped_at)
    answered_at: list[float] = []
    accepted: list[bytes] = []

    def handler(request: apis.Message) -> list[Any]:
        answered_at.append(time.monotonic())
        results = []
        for entry, data in zip(request.body["entries"], request.batches, strict=True):
            results.append({"topic": entry["topic"], "partition": entry["partition"], "error": 0,
                            "base_offset": len(accepted), "log_start_offset": 0, "message": ""})
            accepted.append(bytes(data))
        return apis.encode_response(request.header, {"results": results})

    set_handler(handler)
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC, "-p", "0", "-s", "1",
                          "-T", "20000"], input=b"a\nb\nc\n", capture_output=True, timeout=PROCESS_TIMEOUT_S,
                         check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert b"3 acknowledged, 0 failed" in run.stderr, run.stderr.decode()
    assert dropped_at and answered_at
    resent_after_s = answered_at[0] - dropped_at[0]
    assert resent_after_s < RESEND_AFTER_DROP_S_MAX, f"resent {resent_after_s:.1f} s after the drop"
    first = node.produce_batches[0][0]
    assert accepted[0] == first  # the dropped batch, resent as it was
    assert [batch_format.decode_batch(data).values for data in accepted] == [[b"a"], [b"b"], [b"c"]]


def test_consumer_fetches_again_at_once_when_the_leaders_connection_drops(c_client: CClient,
                                                                         fake_node: Any) -> None:
    """The leader takes the first FETCH and drops its connections unanswered, then is back at
    the same address: the consumer fetches again within seconds, not after max_wait_ms +
    request_timeout_ms (30.5 s), and reads the records."""
    node, set_handler = fake_node
    dropped_at: list[float] = []
    node.drop_after = drop_once(ApiKey.FETCH, dropped_at)
    answered_at: list[float] = []

    def handler(request: apis.Message) -> list[Any]:
        answered_at.append(time.monotonic())
        return fetch_answer(request, [good_batch(0)])

    set_handler(handler)
    assert consume_two_offsets(c_client, node.address, idle_ms=20_000) == ["0", "1"]
    assert node.fetch_requests >= 2
    resent_after_s = answered_at[0] - dropped_at[0]
    assert resent_after_s < RESEND_AFTER_DROP_S_MAX, f"fetched again {resent_after_s:.1f} s after the drop"


def test_consumer_poll_returns_within_its_timeout_when_the_leader_never_answers(
        c_client: CClient, fake_node: Any) -> None:
    """A leader that takes FETCH and never answers (stopped, or killed after taking it): each
    fabric_consumer_poll still returns within its timeout (the FETCH stays pending for the
    next poll), so fabric-consume -i 300 stops after about 300 ms. It used to wait
    max_wait + request_timeout_ms (30 s) inside one poll."""
    node, set_handler = fake_node
    set_handler(lambda request: None)  # FETCH is read and never answered
    started = time.monotonic()
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "0",
                          "-i", "300"], capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stderr.decode()
    assert node.fetch_requests >= 1
    assert elapsed < 10, f"fabric-consume -i 300 took {elapsed:.1f} s"
    assert b"0 records" in run.stderr


def compile_program(c_client: CClient, tmp_path: Path, name: str, source: str, *link_flags: str) -> Path:
    """A test program against libfabric.a (with the sanitizers' flags when those are on)."""
    source_path, binary = tmp_path / f"{name}.c", tmp_path / name
    source_path.write_text(source)
    subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", *c_client.cflags, f"-I{c_client.root}", str(source_path),
                    str(c_client.static_lib), *link_flags, "-lzmq", "-llz4", "-lz", "-o", str(binary)],
                   check=True, timeout=120)
    return binary


_PATIENT_CONSUMER_C = r"""
#include <limits.h>
#include <stdio.h>
#include <fabric.h>

/* argv: bootstrap topic. A consumer that waits "forever" for a FETCH answer. */
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    fabric_consumer_config_t cfg;
    fabric_consumer_config_init(&cfg);
    cfg.max_wait_ms = 100;
    cfg.request_timeout_ms = INT_MAX;
    fabric_consumer_t *c;
    if (fabric_consumer_new(&c, argv[1], &cfg)) return 3;
    if (fabric_consumer_assign(c, argv[2], 0, 0)) return 4;
    for (int i = 0; i < 4; i++) {
        const fabric_record_t *r;
        int rc = fabric_consumer_poll(c, 100, &r);
        if (rc || r) {
            printf("poll %d: %s %s\n", i, fabric_err_name(rc), fabric_consumer_last_error(c));
            return 5;
        }
    }
    printf("last error: [%s]\n", fabric_consumer_last_error(c));
    fabric_consumer_destroy(c);
    return 0;
}
"""


def test_consumer_request_timeout_of_int_max_keeps_one_fetch_pending(c_client: CClient, fake_node: Any,
                                                                      tmp_path: Path) -> None:
    """request_timeout_ms = INT_MAX is a valid config ("wait for ever"): max_wait_ms + it
    overflowed an int (UBSan: signed integer overflow in send_fetch), wrapped negative,
    and the unanswered FETCH was given up at once and sent again after every backoff."""
    node, set_handler = fake_node
    set_handler(lambda request: None)  # FETCH is read and never answered
    binary = compile_program(c_client, tmp_path, "patient_consumer", _PATIENT_CONSUMER_C)
    run = subprocess.run([str(binary), node.address, TOPIC], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no answer within" not in run.stdout, run.stdout
    assert node.fetch_requests == 1  # still waiting for the first answer


def test_record_above_message_bytes_max_is_refused_before_sending(c_client: CClient, fake_node: Any) -> None:
    """The topic's message_bytes_max (8 MiB here) is checked per record as the Python producer
    does: MESSAGE_TOO_LARGE from fabric_produce, instead of a batch the node refuses with the
    records that share it."""
    node, set_handler = fake_node
    set_handler(lambda request: produce_result(request, 0, 0))
    big = b"x" * (9 << 20)
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC, "-z", "none",
                          "-s", str(16 << 20)], input=b"small\n" + big + b"\n",
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1, run.stderr.decode()
    assert b"record 2: MESSAGE_TOO_LARGE" in run.stderr
    assert b"message_bytes_max=8388608" in run.stderr
    sent = [frame for request in node.produce_batches for frame in request]
    assert all(len(frame) <= 8 << 20 for frame in sent)
    assert [v for frame in sent for v in batch_format.decode_batch(frame).values] == [b"small"]


def test_metadata_lookups_end_by_the_callers_time(c_client: CClient) -> None:
    """With every node connected but silent (stopped), a METADATA lookup tried each node
    for 5 s in turn: fabric_produce of a new topic with max_block_ms=500 and
    fabric_topic_partition_count(..., 500) both took 20 s against four such nodes. Each
    now ends by the caller's time (plus one short attempt)."""
    context = zmq.Context()
    silent = [context.socket(zmq.ROUTER) for _ in range(4)]  # accept, never answer
    try:
        addresses = [f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in silent]
        run = subprocess.run([str(c_client.test_deadlines), ",".join(addresses)],
                             capture_output=True, text=True, timeout=120, check=False)
    finally:
        for sock in silent:
            sock.close(linger=0)
        context.term()
    assert run.returncode == 0, run.stdout + run.stderr
    took = {name: (result, int(ms)) for name, result, ms in (line.split() for line in run.stdout.splitlines())}
    assert set(took) == {"produce", "partition_count"}, run.stdout
    for name, (result, ms) in took.items():
        assert result == "NO_NODES" and ms < 5_000, (name, result, ms)  # one node alone took 5 s before


def test_consumer_turns_the_order_of_its_fetch_partitions(c_client: CClient, fake_node: Any) -> None:
    """A node fills a FETCH answer in the request's partition order until max_bytes
    (docs/PROTOCOL.md 5.3): the C consumer listed its partitions in one fixed order, so the
    first ones with a backlog starved the rest. Each FETCH now starts one partition on."""
    node, set_handler = fake_node
    node.partitions = 3

    def empty_answer(request: apis.Message) -> list[Any]:
        body = {"partitions": [{"topic": p["topic"], "partition": p["partition"], "error": 0, "high_watermark": 0,
                                "log_start_offset": 0, "log_end_offset": 0, "batch_count": 0}
                               for p in request.body["partitions"]]}
        return apis.encode_response(request.header, body)

    set_handler(empty_answer)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-p", "1", "-p", "2",
                          "-o", "0", "-i", "300"], capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    orders = node.fetch_orders
    assert len(orders) >= 3 and all(sorted(order) == [0, 1, 2] for order in orders), orders
    assert {order[0] for order in orders} == {0, 1, 2}, orders[:6]


def list_offsets_answer(request: apis.Message, offset: int, partition: int | None = None) -> list[Any]:
    p = request.body["partitions"][0]
    body = {"partitions": [{"topic": p["topic"], "partition": p["partition"] if partition is None else partition,
                            "error": 0, "timestamp": -1, "offset": offset}]}
    return apis.encode_response(request.header, body)


def out_of_range_answer(request: apis.Message, log_start: int, log_end: int, high_watermark: int | None = None
                        ) -> list[Any]:
    """As a node answers a fetch outside the log: its bounds and high watermark (the log
    end unless given)."""
    p = request.body["partitions"][0]
    hw = log_end if high_watermark is None else high_watermark
    body = {"partitions": [{"topic": p["topic"], "partition": p["partition"], "error": 10, "high_watermark": hw,
                            "log_start_offset": log_start, "log_end_offset": log_end, "batch_count": 0}]}
    return apis.encode_response(request.header, body)


def idle_fetch_answer(request: apis.Message) -> list[Any]:
    time.sleep(0.05)  # the end of the log: as a node holding the fetch, not a busy loop
    return fetch_answer(request, [])


@pytest.mark.parametrize(("hostile_offset", "hostile_partition"),
                         [(-5, None), (-1, None), (-(1 << 63), None), (2, 7)])
def test_consumer_refuses_a_list_offsets_answer_that_is_no_position(
        c_client: CClient, fake_node: Any, hostile_offset: int, hostile_partition: int | None) -> None:
    """LIST_OFFSETS for the log start answered with a negative offset (or for another
    partition): the C consumer took it as its position, and a negative position means "not
    resolved yet", so it asked LIST_OFFSETS again with that offset as the timestamp (-1:
    the log end instead of the start; -5: a timestamp the node refuses). Such an answer is
    now a retriable error for the partition: the same question again after a backoff."""
    node, set_handler = fake_node
    asked: list[int] = []  # the timestamp of each LIST_OFFSETS
    fetched: list[int] = []  # the fetch_offset of each FETCH

    def handler(request: apis.Message) -> list[Any]:
        if request.header.api_key == ApiKey.LIST_OFFSETS:
            asked.append(request.body["partitions"][0]["timestamp"])
            if len(asked) == 1:
                return list_offsets_answer(request, hostile_offset, hostile_partition)
            return list_offsets_answer(request, 2)
        fetched.append(request.body["partitions"][0]["fetch_offset"])
        return fetch_answer(request, [good_batch(2)]) if fetched[-1] == 2 else idle_fetch_answer(request)

    set_handler(handler)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "beginning",
                          "-c", "2", "-i", "5000", "-F", "offset"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert asked == [-2, -2], asked
    assert fetched and fetched[0] == 2 and min(fetched) >= 0, fetched
    assert run.stdout.decode().splitlines() == ["2", "3"]


@pytest.mark.parametrize(("reset", "timestamp"), [("earliest", -2), ("latest", -1)])
@pytest.mark.parametrize("bounds", [(-7, -3), (5, 3), (-(1 << 63), (1 << 63) - 1)])
def test_consumer_resets_by_list_offsets_when_out_of_range_bounds_are_no_offsets(
        c_client: CClient, fake_node: Any, reset: str, timestamp: int, bounds: tuple[int, int]) -> None:
    """OFFSET_OUT_OF_RANGE carries the log start and end: the C consumer jumped to one of
    them whatever they were, and a negative one then went out as a LIST_OFFSETS timestamp
    (or a start past the end was fetched). Bounds that are not 0 <= start <= end are not
    used: the consumer resets as the Python consumer always does, by LIST_OFFSETS."""
    node, set_handler = fake_node
    asked: list[int] = []
    fetched: list[int] = []

    def handler(request: apis.Message) -> list[Any]:
        if request.header.api_key == ApiKey.LIST_OFFSETS:
            asked.append(request.body["partitions"][0]["timestamp"])
            return list_offsets_answer(request, 2)
        fetched.append(request.body["partitions"][0]["fetch_offset"])
        if fetched[-1] == 50:
            return out_of_range_answer(request, *bounds)
        return fetch_answer(request, [good_batch(2)]) if fetched[-1] == 2 else idle_fetch_answer(request)

    set_handler(handler)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "50",
                          "-z", reset, "-c", "2", "-i", "5000", "-F", "offset"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert asked == [timestamp], asked
    assert fetched[:2] == [50, 2] and min(fetched) >= 0, fetched
    assert run.stdout.decode().splitlines() == ["2", "3"]


@pytest.mark.parametrize(("reset", "records"), [("earliest", ["2", "3"]), ("latest", ["4", "5"])])
def test_consumer_resets_to_out_of_range_bounds_that_are_offsets(c_client: CClient, fake_node: Any, reset: str,
                                                                 records: list[str]) -> None:
    """Usable OFFSET_OUT_OF_RANGE bounds are still taken as they come, with no LIST_OFFSETS:
    the log start for earliest, the high watermark (4) for latest, not the log end (6):
    records 4 and 5 are not committed yet, and a position at 6 would skip them once they are."""
    node, set_handler = fake_node
    asked: list[int] = []

    def handler(request: apis.Message) -> list[Any]:
        if request.header.api_key == ApiKey.LIST_OFFSETS:
            asked.append(request.body["partitions"][0]["timestamp"])
            return list_offsets_answer(request, 0)
        offset = request.body["partitions"][0]["fetch_offset"]
        if offset == 50:
            return out_of_range_answer(request, 2, 6, high_watermark=4)
        return fetch_answer(request, [good_batch(offset)]) if offset in (2, 4, 6) else idle_fetch_answer(request)

    set_handler(handler)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "50",
                          "-z", reset, "-c", "2", "-i", "5000", "-F", "offset"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert asked == []
    assert run.stdout.decode().splitlines() == records


def test_consumer_ignores_fetch_results_for_partitions_it_did_not_ask_for(c_client: CClient,
                                                                           fake_node: Any) -> None:
    """A FETCH answer may name only partitions the FETCH asked for. One carrying records of
    another assigned partition (here partition 1, whose start offset is not known yet: its
    LIST_OFFSETS answers are unusable) had them handed out, and the position taken from
    them, as if they had been fetched from it."""
    node, set_handler = fake_node
    node.partitions = 2

    def handler(request: apis.Message) -> list[Any]:
        if request.header.api_key == ApiKey.LIST_OFFSETS:
            p = request.body["partitions"][0]["partition"]
            return list_offsets_answer(request, 2 if p == 0 else -1)
        asked = request.body["partitions"]
        if asked[0]["fetch_offset"] != 2:
            return idle_fetch_answer(request)
        results = [{"topic": TOPIC, "partition": p, "error": 0, "high_watermark": 100, "log_start_offset": 0,
                    "log_end_offset": 100, "batch_count": 1} for p in (1, 0)]
        return apis.encode_response(request.header, {"partitions": results}, [good_batch(0), good_batch(2)])

    set_handler(handler)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-p", "1",
                          "-o", "beginning", "-c", "2", "-i", "3000", "-F", "partition,offset"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert node.fetch_orders and all(order == [0] for order in node.fetch_orders), node.fetch_orders
    assert run.stdout.decode().splitlines() == ["0\t2", "0\t3"]


_ALLOCATION_FAILURES_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <fabric.h>

/* Linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc against libfabric.a: the
 * library's allocations come here (libzmq's and liblz4's, in their shared objects, do not),
 * and the one numbered countdown after arming fails. */
void *__real_malloc(size_t size);
void *__real_calloc(size_t count, size_t size);
void *__real_realloc(void *old, size_t size);
static long countdown; /* 0: no failure armed */
static int injected;

static int fail_now(void) {
    if (countdown == 0 || --countdown > 0) return 0;
    injected = 1;
    return 1;
}
void *__wrap_malloc(size_t size) { return fail_now() ? NULL : __real_malloc(size); }
void *__wrap_calloc(size_t count, size_t size) { return fail_now() ? NULL : __real_calloc(count, size); }
void *__wrap_realloc(void *old, size_t size) { return fail_now() ? NULL : __real_realloc(old, size); }

/* argv: bootstrap topic. The first fabric_produce to a topic with its n-th allocation
 * failing, for n = 1, 2, ... until one needs no more than n - 1: whatever it returned, the
 * producer must then take keyless and keyed records for the topic and know its partitions. */
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    fabric_producer_config_t cfg;
    fabric_producer_config_init(&cfg);
    cfg.linger_ms = 60000; /* nothing is sent: records wait in their batches */
    for (long n = 1;; n++) {
        fabric_producer_t *p;
        if (fabric_producer_new(&p, argv[1], &cfg)) return 3;
        injected = 0;
        countdown = n;
        int first = fabric_produce(p, argv[2], -1, NULL, -1, "v", 1, NULL, 0, -1);
        countdown = 0;
        int32_t count = 0;
        int keyless = fabric_produce(p, argv[2], -1, NULL, -1, "w", 1, NULL, 0, -1);
        int keyed = fabric_produce(p, argv[2], -1, "k", 1, "x", 1, NULL, 0, -1);
        int counted = fabric_producer_partition_count(p, argv[2], &count);
        if (keyless || keyed || counted || count < 1) {
            printf("allocation %ld failed (first produce: %s): then keyless %s, keyed %s, "
                   "partition count %s %d: %s\n", n, fabric_err_name(first), fabric_err_name(keyless),
                   fabric_err_name(keyed), fabric_err_name(counted), (int)count,
                   fabric_producer_last_error(p));
            return 1;
        }
        fabric_producer_destroy(p);
        if (!injected) {
            printf("first produce: %s, %ld allocations\n", fabric_err_name(first), n - 1);
            return first ? 1 : 0;
        }
    }
}
"""


def test_producer_survives_each_allocation_failure_of_a_first_produce(c_client: CClient, fake_node: Any,
                                                                       tmp_path: Path) -> None:
    """A first fabric_produce to a topic registers it and makes a queue per partition: when
    that ran out of memory, the topic stayed registered with 0 partitions, and the next
    keyless record divided by 0 (SIGFPE), a keyed one read queues[-1]. Each allocation of
    the first produce fails in turn here (linker --wrap, nothing compiled into the
    library); every later call must work."""
    node, set_handler = fake_node
    node.partitions = 3
    set_handler(lambda request: produce_result(request, 0, 0))
    binary = compile_program(c_client, tmp_path, "allocation_failures", _ALLOCATION_FAILURES_C,
                             "-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc")
    run = subprocess.run([str(binary), node.address, TOPIC], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stdout}{run.stderr[-3000:]}"
    assert run.stdout.startswith("first produce: NONE, "), run.stdout


def metadata_listing(address: str, partitions: list[int], leader_address: str | None = None) -> dict[str, Any]:
    """A METADATA body naming the topic's partitions as given (numbers in that order), led
    by node 1 at leader_address (the node's own address unless given)."""
    body = metadata_body(address)
    body["nodes"][0]["address"] = address if leader_address is None else leader_address
    body["topics"][0]["partitions"] = [dict(body["topics"][0]["partitions"][0], partition=p) for p in partitions]
    return body


@pytest.mark.parametrize("bad_address", ["garbage", "udp://x", "tcp://host"])
def test_consumer_retries_a_leader_address_zeromq_cannot_parse(c_client: CClient, fake_node: Any,
                                                                 bad_address: str) -> None:
    """A METADATA node list naming the leader at an address libzmq refuses to connect to
    (as the Python SDK's fuzzer found): fabric_consumer_poll failed for good with
    TRANSPORT. It is now a node that is down: back off, ask METADATA again, and fetch from
    the leader once an answer names it where it is."""
    node, set_handler = fake_node
    node.metadata = lambda n: metadata_listing(node.address, [0], bad_address if n <= 2 else None)
    set_handler(lambda request: fetch_answer(request, [good_batch(0)] if request.body["partitions"][0][
        "fetch_offset"] == 0 else []))
    assert consume_two_offsets(c_client, node.address, idle_ms=5000) == ["0", "1"]
    assert node.metadata_requests >= 3


@pytest.mark.parametrize("hostile", [[], [1, 1], [0, 2], [-1, 0]], ids=["none", "twice", "gap", "negative"])
def test_consumer_keeps_a_known_topic_over_an_answer_listing_impossible_partitions(
        c_client: CClient, fake_node: Any, hostile: list[int]) -> None:
    """After a good METADATA answer, every later one lists the topic with no partitions, a
    partition twice, a gap or a negative number (and error 0). The C consumer took each as
    the topic's new map: none gave the partition up after 3 s (UNKNOWN_TOPIC_OR_PARTITION),
    partition 1 twice left partition 0 without a leader, and a number past the count or
    below 0 refused the whole answer (so no node answered). Such an entry is now ignored:
    the topic stays as it was known, and a poll that refreshed fetches on."""
    node, set_handler = fake_node
    node.partitions = 2
    node.metadata = lambda n: metadata_listing(node.address, [0, 1] if n == 1 else hostile)
    fetched: list[int] = []

    def handler(request: apis.Message) -> list[Any]:
        fetched.append(request.body["partitions"][0]["fetch_offset"])
        if len(fetched) == 1:  # NOT_LEADER: the consumer backs off and refreshes its map
            body = {"partitions": [{"topic": TOPIC, "partition": 0, "error": 8, "high_watermark": -1,
                                    "log_start_offset": -1, "log_end_offset": -1, "batch_count": 0}]}
            return apis.encode_response(request.header, body)
        return fetch_answer(request, [good_batch(0)]) if fetched[-1] == 0 else idle_fetch_answer(request)

    set_handler(handler)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "0",
                          "-c", "2", "-i", "4000", "-F", "offset"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode().splitlines() == ["0", "1"], run.stderr.decode()
    assert node.metadata_requests >= 2


def test_producer_does_not_take_a_partition_listed_twice_for_a_smaller_topic(c_client: CClient,
                                                                              fake_node: Any) -> None:
    """A topic whose METADATA lists partition 0 twice (and no partition 1): the C producer
    registered it with one partition and hashed every key over that count, so records
    whose key belongs on partition 1 went to partition 0. The entry is now ignored, as a
    topic the node is still learning: the topic is unknown, and nothing is sent."""
    node, set_handler = fake_node
    node.metadata = lambda n: metadata_listing(node.address, [0, 0])
    set_handler(lambda request: produce_result(request, 0, 0))
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC, "-k", "\t"],
                         input=b"".join(b"key-%d\tv\n" % i for i in range(8)), capture_output=True,
                         timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1, run.stderr.decode()
    assert b"UNKNOWN_TOPIC_OR_PARTITION" in run.stderr
    assert node.produce_batches == []


@pytest.mark.parametrize("level", ["result", "request"])
def test_producer_takes_a_negative_error_code_from_a_node_as_unknown_server_error(
        c_client: CClient, fake_node: Any, level: str) -> None:
    """A node's error code below 0 (i16 on the wire; wire codes are 0..99) was read as one
    of the client's own: -4 as NO_NODES, which is retriable, so the batch was sent again
    and again until the flush gave up. It is now UNKNOWN_SERVER_ERROR, as the Python SDK
    maps every code it does not know: not retried, and named so."""
    node, set_handler = fake_node
    set_handler(lambda request: produce_result(request, -4, 0) if level == "result"
                else apis.encode_error_response(request.header, -4, "scripted"))
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC, "-T", "3000"],
                         input=b"a\n", capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1
    assert b"UNKNOWN_SERVER_ERROR" in run.stderr and b"NO_NODES" not in run.stderr, run.stderr.decode()
    assert len(node.produce_batches) == 1  # not retried


def test_consumer_takes_a_negative_fetch_error_as_unknown_server_error(c_client: CClient,
                                                                       fake_node: Any) -> None:
    """The same for a FETCH result: -4 (NO_NODES to the client, retriable) had the consumer
    back off and fetch again until its idle time ran out, as if the log were empty."""
    node, set_handler = fake_node

    def handler(request: apis.Message) -> list[Any]:
        body = {"partitions": [{"topic": TOPIC, "partition": 0, "error": -4, "high_watermark": -1,
                                "log_start_offset": -1, "log_end_offset": -1, "batch_count": 0}]}
        return apis.encode_response(request.header, body)

    set_handler(handler)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "0",
                          "-i", "2000"], capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1
    assert b"UNKNOWN_SERVER_ERROR" in run.stderr, run.stderr.decode()
    assert node.fetch_requests == 1


@pytest.mark.parametrize(("rows", "asked_again"), [
    ([(7, 0, 9), (0, 0, 2)], False),  # one row more than asked, ours second
    ([(7, 7, -1)], True),  # only another partition's row, with its error (UNKNOWN_TOPIC_OR_PARTITION)
    ([], True),  # no row at all
], ids=["extra-row", "other-partitions-error", "no-row"])
def test_consumer_matches_list_offsets_rows_by_partition(c_client: CClient, fake_node: Any,
                                                         rows: list[tuple[int, int, int]], asked_again: bool) -> None:
    """The LIST_OFFSETS answer's row for the partition is found by topic and partition: an
    answer with a row more than asked failed the poll with MALFORMED_REQUEST, and the one
    row of another partition gave this one its error (UNKNOWN_TOPIC_OR_PARTITION, fatal).
    An answer without the partition's row is asked again, as one with no position."""
    node, set_handler = fake_node
    asked: list[int] = []

    def handler(request: apis.Message) -> list[Any]:
        if request.header.api_key == ApiKey.LIST_OFFSETS:
            asked.append(request.body["partitions"][0]["timestamp"])
            if len(asked) > 1:
                return list_offsets_answer(request, 2)
            body = {"partitions": [{"topic": TOPIC, "partition": p, "error": error, "timestamp": -1,
                                    "offset": offset} for p, error, offset in rows]}
            return apis.encode_response(request.header, body)
        offset = request.body["partitions"][0]["fetch_offset"]
        return fetch_answer(request, [good_batch(2)]) if offset == 2 else idle_fetch_answer(request)

    set_handler(handler)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "beginning",
                          "-c", "2", "-i", "5000", "-F", "offset"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert asked == ([-2, -2] if asked_again else [-2]), asked
    assert run.stdout.decode().splitlines() == ["2", "3"]


def topic_error_listing(address: str, error: int) -> dict[str, Any]:
    """A METADATA body listing the topic with a topic-level error and no partitions, as a node
    answers during an election or before it has learned the topic (nodes/admin.py)."""
    body = metadata_body(address)
    body["topics"][0].update(error=error, message_bytes_max=0, partitions=[])
    return body


TOPIC_ERRORS = pytest.mark.parametrize("topic_error", [9, 7], ids=["LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PARTITION"])


@TOPIC_ERRORS
def test_producer_keeps_a_known_topic_over_an_answer_with_a_topic_error(c_client: CClient, fake_node: Any,
                                                                        topic_error: int) -> None:
    """After a good METADATA answer, the later ones list the topic with an error and no
    partitions. The C producer took that as the topic's new map: no partition had a leader
    any more, and a batch refused once (NOT_LEADER) went round without a leader until the
    flush gave up. The map it knew is now kept (as the Python SDK keeps it on
    LEADER_NOT_AVAILABLE), and the batch is resent to the leader it names."""
    node, set_handler = fake_node
    node.metadata = lambda n: metadata_body(node.address) if n == 1 else topic_error_listing(node.address, topic_error)
    answers = iter([8])  # NOT_LEADER once: the producer asks METADATA again
    set_handler(lambda request: produce_result(request, next(answers, 0), 0))
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC, "-T", "3000"], input=b"a\n",
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert len(node.produce_batches) == 2
    assert node.metadata_requests >= 2


@pytest.mark.parametrize(("topic_error", "name"), [(9, b"LEADER_NOT_AVAILABLE"), (80, b"AUTHORIZATION_FAILED")])
def test_producer_reports_the_topic_error_of_a_topic_it_never_knew(c_client: CClient, fake_node: Any,
                                                                   topic_error: int, name: bytes) -> None:
    """With no map of the topic to keep, the first fabric_produce to it returns the node's error."""
    node, set_handler = fake_node
    node.metadata = lambda n: topic_error_listing(node.address, topic_error)
    set_handler(lambda request: produce_result(request, 0, 0))
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC], input=b"a\n",
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1
    assert name in run.stderr, run.stderr.decode()
    assert node.produce_batches == []


@pytest.mark.parametrize(("topic_error", "name"), [
    (80, b"AUTHORIZATION_FAILED"),
    (22, b"INVALID_CONFIG"),  # any code that is not retriable, as it came
    (-4, b"UNKNOWN_SERVER_ERROR"),  # a node's code below 0 (NO_NODES to the client, retriable)
    (7, b"UNKNOWN_TOPIC_OR_PARTITION"),
], ids=["AUTHORIZATION_FAILED", "INVALID_CONFIG", "negative", "UNKNOWN_TOPIC_OR_PARTITION"])
def test_consumer_reports_the_topic_error_of_a_topic_it_never_knew(c_client: CClient, fake_node: Any,
                                                                   topic_error: int, name: bytes) -> None:
    """An assigned topic every METADATA answer lists with an error that is not retriable:
    the poll returns that error, last_error naming the topic and the error. The C consumer
    turned every such error into UNKNOWN_TOPIC_OR_PARTITION, so a principal refused the
    topic (AUTHORIZATION_FAILED, nodes/authz.py) was told it did not exist; the Python
    consumer raises AuthorizationFailedError."""
    node, set_handler = fake_node
    node.metadata = lambda n: topic_error_listing(node.address, topic_error)
    set_handler(lambda request: fetch_answer(request, [good_batch(0)]))
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "0",
                          "-i", "2000"], capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1
    assert b"fabric-consume: " + name + b": " + TOPIC.encode() + b"/0: " in run.stderr, run.stderr.decode()
    assert b"METADATA lists the topic with " + name in run.stderr, run.stderr.decode()
    assert node.fetch_requests == 0


@pytest.mark.parametrize("topic_error", [9, 25], ids=["LEADER_NOT_AVAILABLE", "NODE_NOT_READY"])
def test_consumer_waits_on_a_retriable_topic_error(c_client: CClient, fake_node: Any, topic_error: int) -> None:
    """A retriable topic error (an election, a node starting) is waited on: the consumer asks
    METADATA again after retry_backoff_ms, and reads once the topic is listed. NODE_NOT_READY
    failed the poll with UNKNOWN_TOPIC_OR_PARTITION, as every error but LEADER_NOT_AVAILABLE."""
    node, set_handler = fake_node
    node.metadata = lambda n: topic_error_listing(node.address, topic_error) if n <= 2 else metadata_body(node.address)
    set_handler(lambda request: fetch_answer(request, [good_batch(0)]) if request.body["partitions"][0][
        "fetch_offset"] == 0 else idle_fetch_answer(request))
    assert consume_two_offsets(c_client, node.address, idle_ms=2000) == ["0", "1"]
    assert node.metadata_requests >= 3


@TOPIC_ERRORS
def test_consumer_keeps_a_known_topic_over_an_answer_with_a_topic_error(c_client: CClient, fake_node: Any,
                                                                        topic_error: int) -> None:
    """The same for the consumer: after NOT_LEADER it asks METADATA again, and the answer's
    topic error replaced the map. UNKNOWN_TOPIC_OR_PARTITION (a node that has not learned the
    topic yet) failed the poll for good; LEADER_NOT_AVAILABLE left it fetching nothing."""
    node, set_handler = fake_node
    node.metadata = lambda n: metadata_body(node.address) if n == 1 else topic_error_listing(node.address, topic_error)

    def handler(request: apis.Message) -> list[Any]:
        if node.fetch_requests == 1:
            body = {"partitions": [{"topic": TOPIC, "partition": 0, "error": 8, "high_watermark": -1,
                                    "log_start_offset": -1, "log_end_offset": -1, "batch_count": 0}]}
            return apis.encode_response(request.header, body)
        return fetch_answer(request, [good_batch(0)]) if request.body["partitions"][0]["fetch_offset"] == 0 \
            else idle_fetch_answer(request)

    set_handler(handler)
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "0",
                          "-c", "2", "-i", "2000", "-F", "offset"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode().splitlines() == ["0", "1"], run.stderr.decode()
    assert node.metadata_requests >= 2


def without_response_flag(message: list[Any]) -> list[Any]:
    """The message with its header's response flag (flags bit 0, PROTOCOL.md section 2) cleared."""
    header = bytearray(message[0])
    header[5] &= 0xFE
    return [bytes(header), *message[1:]]


@pytest.mark.parametrize("hostile", ["answer-without-flag", "request"])
def test_producer_takes_no_metadata_answer_without_the_response_flag(c_client: CClient, fake_node: Any,
                                                                     hostile: str) -> None:
    """Before each METADATA answer the node sends a message with the request's id and API but
    no response flag: an answer body saying the topic is unknown, or a METADATA request. The
    C client took either as the answer (the first failed the produce with
    UNKNOWN_TOPIC_OR_PARTITION, the second as MALFORMED_REQUEST from the only node). It is
    now dropped, as an answer to another request is, and the answer that follows is taken."""
    node, set_handler = fake_node
    set_handler(lambda request: produce_result(request, 0, 0))

    def before_answer(request: apis.Message) -> list[list[Any]]:
        if request.header.api_key != ApiKey.METADATA:
            return []
        if hostile == "request":
            return [apis.encode_request(ApiKey.METADATA, {"topics": [TOPIC]}, request.header.correlation_id)]
        return [without_response_flag(apis.encode_response(request.header, topic_error_listing(node.address, 7)))]

    node.before_answer = before_answer
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC], input=b"a\n",
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert len(node.produce_batches) == 1


def test_consumer_takes_no_fetch_answer_without_the_response_flag(c_client: CClient, fake_node: Any) -> None:
    """The same for a FETCH: records in a message without the response flag were handed out."""
    node, set_handler = fake_node
    set_handler(lambda request: fetch_answer(request, [good_batch(0)]) if request.body["partitions"][0][
        "fetch_offset"] == 0 else idle_fetch_answer(request))
    forged = batch_format.encode_batch([1_700_000_000_000, 1_700_000_000_001], [None, None], [b"x", b"y"],
                                       codec=batch_format.CODEC_NONE, base_offset=0, leader_epoch=0)
    node.before_answer = lambda request: ([without_response_flag(fetch_answer(request, [forged]))]
                                          if request.header.api_key == ApiKey.FETCH else [])
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-o", "0",
                          "-c", "2", "-i", "2000", "-F", "value"],
                         capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode().splitlines() == ["a", "b"]


_MOVING_LEADER_C = r"""
#include <stdio.h>
#include <fabric.h>

/* argv: bootstrap topic. One poll, of up to 5 s, by a consumer that asks METADATA again at
 * once after each NOT_LEADER (retry_backoff_ms 0). */
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    fabric_consumer_config_t cfg;
    fabric_consumer_config_init(&cfg);
    cfg.retry_backoff_ms = 0;
    fabric_consumer_t *c;
    if (fabric_consumer_new(&c, argv[1], &cfg) || fabric_consumer_assign(c, argv[2], 0, 0)) return 3;
    const fabric_record_t *r = NULL;
    int rc = fabric_consumer_poll(c, 5000, &r);
    printf("%s %lld: %s\n", fabric_err_name(rc), r ? (long long)r->offset : -1LL, fabric_consumer_last_error(c));
    fabric_consumer_destroy(c);
    return rc != 0 || r == NULL;
}
"""
# Addresses the moving leader takes in turn: more than the C client could once keep open at
# once. Its table holds FABRIC_NODES_MAX = 1,024 addresses, but each took six ZeroMQ sockets
# (two DEALERs and their handshake monitors, two sockets each) of the 1,023 libzmq allows a
# context by default, so it ran out at the 171st: "cannot open a socket ...: Too many open
# files". (It now takes four, of a context sized for the whole table: see the test below.)
LEADER_ADDRESSES = 300


@pytest.mark.parametrize("fake_node", [LEADER_ADDRESSES], indirect=True)
def test_consumer_follows_a_leader_through_more_addresses_than_it_can_keep_open(c_client: CClient, fake_node: Any,
                                                                                 tmp_path: Path) -> None:
    """A long-lived client in a cluster whose nodes come and go on new ports: after each
    FETCH, answered NOT_LEADER, the METADATA answer names the leader at the next address,
    until the consumer has been at every one. Every address the C client ever used kept its
    sockets, so it ran out and the poll ended without the record, asking METADATA in a loop.
    Sockets of an address neither in the METADATA node list nor a bootstrap address are now
    closed after each refresh (none with a request outstanding), and the slot reused."""
    node, set_handler = fake_node
    node.metadata = lambda n: metadata_listing(node.address, [0],
                                               node.addresses[node.fetch_requests % LEADER_ADDRESSES])

    def handler(request: apis.Message) -> list[Any]:
        if node.fetch_requests < LEADER_ADDRESSES:
            body = {"partitions": [{"topic": TOPIC, "partition": 0, "error": 8, "high_watermark": -1,
                                    "log_start_offset": -1, "log_end_offset": -1, "batch_count": 0}]}
            return apis.encode_response(request.header, body)
        return fetch_answer(request, [good_batch(0)])

    set_handler(handler)
    binary = compile_program(c_client, tmp_path, "moving_leader", _MOVING_LEADER_C)
    run = subprocess.run([str(binary), node.address, TOPIC], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.startswith("NONE 0: "), run.stdout
    assert node.fetch_requests == LEADER_ADDRESSES  # one at each address, the last answered


@pytest.mark.parametrize("base_offset", [-1, -7, batch_format.OFFSET_MAX])
def test_producer_refuses_a_base_offset_no_log_has(c_client: CClient, fake_node: Any, base_offset: int) -> None:
    """A PRODUCE answer with no error whose base offset no log has (below 0: this producer
    sends no sequence numbers; or its two records past 2^63 - 1) was handed to the delivery
    callback as the records' offset. The batch now fails with UNKNOWN_SERVER_ERROR and is
    not sent again (it may be stored), as in the Python producer."""
    node, set_handler = fake_node
    set_handler(lambda request: produce_result(request, 0, base_offset))
    run = subprocess.run([str(c_client.produce), "-b", node.address, "-t", TOPIC, "-T", "3000"],
                         input=b"a\nb\n", capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 1
    assert b"UNKNOWN_SERVER_ERROR" in run.stderr and b"base offset" in run.stderr, run.stderr.decode()
    assert len(node.produce_batches) == 1  # not retried


@pytest.mark.parametrize("fake_node", [3], indirect=True)
def test_producer_takes_an_answer_held_across_a_refresh_that_drops_its_address(c_client: CClient,
                                                                              fake_node: Any) -> None:
    """The answer to a PRODUCE is held back by its node while a METADATA refresh names that
    node at another address only: the connection the PRODUCE went out on is then in neither
    the node list nor the bootstrap list, and would be closed with the refresh's other
    unused ones (client_close_unused_conns), losing the answer: the batch would wait out
    request_timeout_ms and be sent again (with the producer's busy marking taken out, the
    flush here ends with both batches pending). A connection with a request in flight stays
    open until it is answered: the held answer is taken, its batch delivered once, not resent.

    Ports: 0 the bootstrap, 1 where the first METADATA answer puts the leader, 2 where the
    second moves it. One record a batch (-s 1): "a" goes out, then "b" (pipelined, while
    "a" waits) is refused NOT_LEADER, which makes the producer refresh; the answer to "a"
    goes out right after that METADATA answer, then "b" is resent at port 2."""
    node, set_handler = fake_node
    bootstrap, first_leader, second_leader = node.addresses
    node.metadata = lambda n: metadata_listing(bootstrap, [0], first_leader if n == 1 else second_leader)
    node.hold_answer = lambda request: ((lambda: node.metadata_requests >= 2)
                                        if request.header.api_key == ApiKey.PRODUCE
                                        and batch_format.decode_batch(request.batches[0]).values == [b"a"] else None)
    refused: list[bytes] = []

    def handler(request: apis.Message) -> list[Any]:
        value = batch_format.decode_batch(request.batches[0]).values[0]
        if value == b"b" and not refused:
            refused.append(value)
            return produce_result(request, 8, 0)  # NOT_LEADER: refresh
        return produce_result(request, 0, 0 if value == b"a" else 1)

    set_handler(handler)
    run = subprocess.run([str(c_client.produce), "-b", bootstrap, "-t", TOPIC, "-p", "0", "-s", "1",
                          "-T", "3000"], input=b"a\nb\n", capture_output=True, timeout=PROCESS_TIMEOUT_S,
                         check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert b"2 acknowledged, 0 failed, 2 batches" in run.stderr, run.stderr.decode()
    sent = [batch_format.decode_batch(request[0]).values for request in node.produce_batches]
    assert sent == [[b"a"], [b"b"], [b"b"]]  # "a" once (its held answer taken), "b" resent after NOT_LEADER
    assert node.metadata_requests == 2  # the answer to "a" was held until the second one


_NOW_MS_C = r"""
#include <time.h>

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}
"""
_EVERY_PARTITION_C = _NOW_MS_C + r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <fabric.h>


/* argv: bootstrap topic partitions. A consumer of partitions 0..n-1 from offset 0 polls until
 * each has given a record (or 10 s pass), and says how many did. */
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int n = atoi(argv[3]);
    /* Each node address takes six file descriptors: as an application talking to many nodes
     * does, raise the soft open-file limit to the hard one (docs/C_CLIENT.md). */
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    fabric_consumer_t *c;
    if (fabric_consumer_new(&c, argv[1], NULL)) return 3;
    for (int p = 0; p < n; p++)
        if (fabric_consumer_assign(c, argv[2], p, 0)) return 3;
    char *seen = calloc((size_t)n, 1);
    int count = 0, rc = 0;
    long long deadline = now_ms() + 10000;
    while (count < n && now_ms() < deadline) {
        const fabric_record_t *r = NULL;
        rc = fabric_consumer_poll(c, 500, &r);
        if (rc) break;
        if (r && !seen[r->partition]) seen[r->partition] = 1, count++;
    }
    printf("%d of %d partitions: %s: %s\n", count, n, fabric_err_name(rc), fabric_consumer_last_error(c));
    free(seen);
    fabric_consumer_destroy(c);
    return count != n;
}
"""
# Node addresses one consumer reads from at once: above the ~170 that libzmq's default of
# 1,023 sockets a context allowed (six sockets each, then), and quick to go through.
SIMULTANEOUS_ADDRESSES = 300


@pytest.mark.parametrize("fake_node", [SIMULTANEOUS_ADDRESSES], indirect=True)
def test_consumer_reads_from_more_node_addresses_at_once_than_a_default_context_allows(
        c_client: CClient, fake_node: Any, tmp_path: Path) -> None:
    """Partition p is led by node p + 1 at the node's p-th port, all listed in every METADATA
    answer, so the consumer keeps a connection to each at once (none is unused). Its context
    kept libzmq's ZMQ_MAX_SOCKETS of 1,023, and at six sockets an address the 171st could not
    be opened ("Too many open files"): 170 partitions were read, the others never. The client
    now sizes its context for FABRIC_NODES_MAX addresses (capped by ZMQ_SOCKET_LIMIT) and
    takes four sockets an address."""
    node, set_handler = fake_node
    # This process holds the node's end of every connection (two an address) and its ports.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * SIMULTANEOUS_ADDRESSES + 256
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below the {wanted} files this test needs")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    body = metadata_body(node.address, SIMULTANEOUS_ADDRESSES)
    body["nodes"] = [{"node_id": i + 1, "address": address} for i, address in enumerate(node.addresses)]
    for p in body["topics"][0]["partitions"]:
        p.update(leader=p["partition"] + 1, replicas=[p["partition"] + 1], isr=[p["partition"] + 1])
    node.metadata = lambda n: body
    set_handler(lambda request: fetch_answer(request, [good_batch(0)] if request.body["partitions"][0][
        "fetch_offset"] == 0 else []))
    binary = compile_program(c_client, tmp_path, "every_partition", _EVERY_PARTITION_C)
    try:
        run = subprocess.run([str(binary), node.address, TOPIC, str(SIMULTANEOUS_ADDRESSES)], capture_output=True,
                             text=True, timeout=PROCESS_TIMEOUT_S, check=False)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.startswith(f"{SIMULTANEOUS_ADDRESSES} of {SIMULTANEOUS_ADDRESSES} partitions"), run.stdout


_METADATA_WAIT_C = _NOW_MS_C + r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <fabric.h>


/* argv: bootstrap topic metadata_wait_ms. Polls of 100 ms until one returns an error or a
 * record (or 5 s pass): that poll's error, when it came, and what it said; then the error of
 * one more poll of 100 ms. */
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    fabric_consumer_config_t cfg;
    fabric_consumer_config_init(&cfg);
    cfg.metadata_wait_ms = atoi(argv[3]);
    fabric_consumer_t *c;
    if (fabric_consumer_new(&c, argv[1], &cfg) || fabric_consumer_assign(c, argv[2], 0, 0)) return 3;
    const fabric_record_t *r = NULL;
    int rc = 0;
    long long start = now_ms();
    while (rc == 0 && r == NULL && now_ms() - start < 5000) rc = fabric_consumer_poll(c, 100, &r);
    printf("%s %lld %s\n", fabric_err_name(rc), now_ms() - start, fabric_consumer_last_error(c));
    printf("%s\n", fabric_err_name(fabric_consumer_poll(c, 100, &r)));
    fabric_consumer_destroy(c);
    return 0;
}
"""
METADATA_WAIT_MS = 600


@pytest.mark.parametrize(("topic_error", "said"), [
    (25, "listed the topic with NODE_NOT_READY"),
    (9, "listed the topic with LEADER_NOT_AVAILABLE"),
    (None, "given the topic no partitions"),  # listed with none and no error: not trusted
], ids=["NODE_NOT_READY", "LEADER_NOT_AVAILABLE", "no_partitions"])
def test_consumer_waits_on_a_retriable_topic_error_only_for_metadata_wait_ms(
        c_client: CClient, fake_node: Any, tmp_path: Path, topic_error: int | None, said: str) -> None:
    """Every METADATA answer lists the assigned topic with a retriable error (or with no
    partitions). The consumer waited for ever, each poll returning no record as at the end of
    a partition, so a caller could not tell a node stuck in NODE_NOT_READY from a quiet log.
    Polls now wait for a map only metadata_wait_ms (counted across polls), then one returns
    REQUEST_TIMED_OUT saying what the answers said, and the next poll waits anew."""
    node, set_handler = fake_node
    node.metadata = lambda n: (metadata_listing(node.address, []) if topic_error is None
                               else topic_error_listing(node.address, topic_error))
    set_handler(lambda request: fetch_answer(request, [good_batch(0)]))
    binary = compile_program(c_client, tmp_path, "metadata_wait", _METADATA_WAIT_C)
    run = subprocess.run([str(binary), node.address, TOPIC, str(METADATA_WAIT_MS)], capture_output=True,
                         text=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    first, again = run.stdout.splitlines()
    name, elapsed_ms, said_text = first.split(" ", 2)
    assert name == "REQUEST_TIMED_OUT", run.stdout
    assert METADATA_WAIT_MS <= int(elapsed_ms) < METADATA_WAIT_MS + 2500, run.stdout
    assert said in said_text and "(metadata_wait_ms)" in said_text, run.stdout
    assert again == "NONE", run.stdout  # the next poll waits anew: no error at once
    assert node.metadata_requests >= 3 and node.fetch_requests == 0


def test_fabric_consume_stops_at_metadata_wait_ms_naming_the_topic(c_client: CClient, fake_node: Any) -> None:
    """fabric-consume --metadata-wait-ms: every METADATA answer lists the topic with
    NODE_NOT_READY, so the poll returns REQUEST_TIMED_OUT after the wait; the tool says so,
    naming the topic, and exits 1 as for its other poll errors, even with --follow (which
    otherwise waits for records for ever). The tool had no such flag: only the library's
    default of 60 s applied, and only with --follow would it ever be reached."""
    node, set_handler = fake_node
    node.metadata = lambda n: topic_error_listing(node.address, 25)  # NODE_NOT_READY
    set_handler(lambda request: fetch_answer(request, [good_batch(0)]))
    started = time.monotonic()
    run = subprocess.run([str(c_client.consume), "-b", node.address, "-t", TOPIC, "-p", "0", "-f",
                          "--metadata-wait-ms", "300"], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S, check=False)
    elapsed = time.monotonic() - started
    assert run.returncode == 1, run.stderr
    assert (f"fabric-consume: REQUEST_TIMED_OUT: {TOPIC}/0: METADATA has listed the topic with NODE_NOT_READY"
            in run.stderr), run.stderr
    assert "(metadata_wait_ms)" in run.stderr, run.stderr
    assert elapsed < 3, f"fabric-consume --metadata-wait-ms 300 took {elapsed:.1f} s"
    assert node.fetch_requests == 0


_REFUSED_LEADER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <fabric.h>

static void on_delivery(const fabric_delivery_t *d, void *opaque) {
    (void)opaque;
    printf("delivery %s: %s\n", fabric_err_name(d->error), d->message);
}

/* argv: bootstrap topic delivery_timeout_ms flush_ms. One record to partition 0, a flush of
 * flush_ms, then destroy: each delivery report (the destroy's too) and the flush's result. */
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    fabric_producer_config_t cfg;
    fabric_producer_config_init(&cfg);
    cfg.request_timeout_ms = 500;
    cfg.delivery_timeout_ms = atoi(argv[3]);
    cfg.on_delivery = on_delivery;
    fabric_producer_t *p;
    if (fabric_producer_new(&p, argv[1], &cfg)) return 3;
    if (fabric_produce(p, argv[2], 0, NULL, -1, "v", 1, NULL, 0, -1)) return 4;
    printf("flush %s\n", fabric_err_name(fabric_producer_flush(p, atoi(argv[4]))));
    fabric_producer_destroy(p);
    return 0;
}
"""


@pytest.mark.parametrize(("delivery_timeout_ms", "flush_ms", "reported"), [
    (800, 10_000, "delivery DELIVERY_TIMEOUT: not acknowledged within delivery_timeout_ms=800 after 0 attempts; "
                  "last error NODE_NOT_READY: node "),
    (60_000, 1500, "delivery CLOSED: producer destroyed before the batch was sent; last error NODE_NOT_READY: node "),
], ids=["delivery_timeout", "destroyed"])
def test_producer_says_why_the_leaders_data_socket_was_refused(c_client: CClient, fake_node: Any, tmp_path: Path,
                                                               delivery_timeout_ms: int, flush_ms: int,
                                                               reported: str) -> None:
    """The bootstrap node answers METADATA (plaintext) naming as the leader a node that
    requires CURVE, so only the sockets to the leader are refused, and the refusal is seen by
    a PRODUCE send on the data socket, never by a METADATA request. The send's error said why
    ("node ... refused the connection: the node requires CURVE ..."), but the batch kept no
    error of its own: once past delivery_timeout_ms it was failed with "not sent within
    delivery_timeout_ms", and destroyed unsent with "producer destroyed before the batch was
    sent", the reason lost. Both now carry the batch's last error."""
    leader_context = zmq.Context()
    leader = leader_context.socket(zmq.ROUTER)
    public_key, secret_key = zmq.curve_keypair()
    leader.curve_server = True
    leader.curve_publickey, leader.curve_secretkey = public_key, secret_key
    leader_address = f"tcp://127.0.0.1:{leader.bind_to_random_port('tcp://127.0.0.1')}"
    node, set_handler = fake_node
    body = metadata_body(node.address)
    body["nodes"].append({"node_id": 2, "address": leader_address})
    body["topics"][0]["partitions"][0].update(leader=2, replicas=[2], isr=[2])
    node.metadata = lambda n: body
    set_handler(lambda request: produce_result(request, 0, 0))
    binary = compile_program(c_client, tmp_path, "refused_leader", _REFUSED_LEADER_C)
    try:
        run = subprocess.run([str(binary), node.address, TOPIC, str(delivery_timeout_ms), str(flush_ms)],
                             capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False)
    finally:
        leader.close(linger=0)
        leader_context.term()
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    delivery = next(line for line in run.stdout.splitlines() if line.startswith("delivery "))
    assert delivery.startswith(reported), run.stdout
    assert f"{leader_address} refused the connection: " in delivery and "requires CURVE" in delivery, run.stdout
    assert node.produce_batches == []  # nothing reached the bootstrap node


def test_delivery_callback_may_produce_but_not_flush_poll_or_destroy(c_client: CClient, fake_node: Any,
                                                                     tmp_path: Path) -> None:
    """sdk/c/tests/test_delivery_callbacks.c against this node. fabric_producer_flush from a
    delivery callback waited for the call running the callback, its whole timeout, then
    returned REQUEST_TIMED_OUT (the Python producer raises RuntimeError at once for the same
    call); fabric_producer_destroy there freed the producer under that call. Both are now
    refused at once (flush and poll INVALID_ARGUMENT, destroy ignored), and a record produced
    from a callback goes out with the flush that ran it."""
    node, set_handler = fake_node
    set_handler(lambda request: produce_result(request, 0, 0))
    source = (c_client.root / "tests" / "test_delivery_callbacks.c").read_text()
    binary = compile_program(c_client, tmp_path, "test_delivery_callbacks", source)
    run = subprocess.run([str(binary), node.address, TOPIC], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S, check=False)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stdout}{run.stderr[-3000:]}"
    assert run.stdout.splitlines()[-1] == "ok", run.stdout
    sent = [value for request in node.produce_batches for frame in request
            for value in batch_format.decode_batch(frame).values]
    assert sent == [b"first", b"from-callback"]  # the destroyed producer's "unsent" never went

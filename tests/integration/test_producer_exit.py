"""No silent loss: a producer nobody closed delivers at exit or after collection, or says
what it lost; the delivery timeout holds in every state; bad headers and large records get
clear answers."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from fabric import errors
from fabric.local import LocalCluster
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from sdk import Admin, Producer
from sdk.accumulator import normalize_headers
from sdk.producer import ORPHAN_IDLE_S, _ProducerCore
from tests.integration.helpers import read_all

REPO = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 120.0


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


EXIT_WITHOUT_CLOSE = """
import sys
from sdk import Producer
producer = Producer(sys.argv[1], linger_ms=50)
for i in range(1000):
    producer.send(sys.argv[2], b"record-%d" % i, key=b"k%d" % (i % 7))
# no flush(), no close(): the interpreter exits with the records still buffered
"""


def test_exit_without_close_delivers_every_record(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3)
    done = run_script(EXIT_WITHOUT_CLOSE, cluster.bootstrap, topic_name)
    assert done.returncode == 0, done.stderr
    assert "not delivered" not in done.stderr
    values = sorted(r.value for r in read_all(cluster.bootstrap, topic_name, 3, expected=1000))
    assert values == sorted(b"record-%d" % i for i in range(1000))


def test_collected_producer_flushes_and_stops_its_thread(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    producer = Producer(cluster.bootstrap, linger_ms=10_000)  # nothing would leave on its own soon
    thread = producer._thread
    for i in range(100):
        producer.send(topic_name, b"v%d" % i)
    del producer
    gc.collect()
    # Orphaned, it sends at once (nobody will flush) and stops once idle for ORPHAN_IDLE_S.
    thread.join(ORPHAN_IDLE_S + 10)
    assert not thread.is_alive()
    assert len(read_all(cluster.bootstrap, topic_name, 1, expected=100)) == 100


def test_a_temporary_producer_delivers(cluster: LocalCluster, topic_name: str) -> None:
    """``Producer(bootstrap).send(...).result()``: the handle is collected before send runs."""
    import asyncio

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    assert Producer(cluster.bootstrap).send(topic_name, b"a").result(30).offset == 0
    sent = asyncio.run(asyncio.to_thread(lambda: Producer(cluster.bootstrap).send(topic_name, b"b").result(30)))
    assert sent.offset == 1
    assert [r.value for r in read_all(cluster.bootstrap, topic_name, 1, expected=2)] == [b"a", b"b"]


class SilentNode:
    """A ROUTER that answers METADATA (one topic, led by itself) and nothing else, so a
    producer's records can never be acknowledged."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.requests: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            envelope, *message = self.router.recv_multipart()
            request = apis.decode_request(message)
            key = request.header.api_key
            self.requests[key] = self.requests.get(key, 0) + 1
            if key == ApiKey.METADATA:
                body: dict[str, Any] = {
                    "controller_id": 1, "nodes": [{"node_id": 1, "address": self.address}],
                    "topics": [{"error": 0, "name": "t", "strict_order": 0, "message_bytes_max": 8 << 20,
                                "partitions": [{"partition": 0, "error": 0, "leader": 1, "leader_epoch": 0,
                                                "replicas": [1], "isr": [1]}]}],
                }
                self.router.send_multipart([envelope, *apis.encode_response(request.header, body)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.router.close(linger=0)
        self.ctx.term()


@pytest.fixture
def silent_node() -> Iterator[SilentNode]:
    node = SilentNode()
    try:
        yield node
    finally:
        node.close()


EXIT_WITH_LOSS = """
import sys
import sdk.producer
from sdk import Producer
sdk.producer.UNCLOSED_FLUSH_S_MAX = 1.0  # the test's node never answers: do not wait 10 s
producer = Producer(sys.argv[1], acks=1, linger_ms=0)
send = producer.send
if sys.argv[2] == "orphaned":
    del producer  # collected: its core is orphaned, and busy until exit
for i in range(1000):
    send("t", b"record-%d" % i)
"""


@pytest.mark.parametrize("handle", ["kept", "orphaned"])
def test_exit_with_undeliverable_records_says_how_many_were_lost(silent_node: SilentNode, handle: str) -> None:
    started = time.monotonic()
    done = run_script(EXIT_WITH_LOSS, silent_node.address, handle)
    assert done.returncode == 0
    assert "1000 of 1000 records were not delivered" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < SUBPROCESS_TIMEOUT_S


def test_delivery_timeout_holds_before_a_producer_id(silent_node: SilentNode) -> None:
    # The node never answers INIT_PRODUCER_ID: the records must still fail in time.
    with Producer(silent_node.address, delivery_timeout_ms=1_500, request_timeout_ms=1_000) as producer:
        future = producer.send("t", b"x")
        with pytest.raises(errors.DeliveryTimeoutError, match="producer id"):
            future.result(30)
    assert silent_node.requests.get(ApiKey.INIT_PRODUCER_ID, 0) >= 1
    assert silent_node.requests.get(ApiKey.PRODUCE, 0) == 0


def test_delivery_timeout_holds_without_answers(silent_node: SilentNode) -> None:
    with Producer(silent_node.address, acks=1, delivery_timeout_ms=1_500, request_timeout_ms=1_000) as producer:
        future = producer.send("t", b"x")
        with pytest.raises(errors.DeliveryTimeoutError):
            future.result(30)


def test_close_zero_fails_what_is_unsent_at_once_without_a_warning(silent_node: SilentNode,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    # close(0), as Kafka's close(Duration.ZERO): no flush, so no "flush timed out" warning
    # for what the caller chose not to wait for (a benchmark's Ctrl-C printed it).
    producer = Producer(silent_node.address, acks=1, linger_ms=0, delivery_timeout_ms=60_000)
    futures = [producer.send("t", b"record-%d" % i) for i in range(100)]
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="fabric.producer"):
        producer.close(0)
    assert time.monotonic() - started < 12  # the sender's stop (SENDER_STOP_S) at most, no flush
    assert not [r for r in caplog.records if "flush timed out" in r.getMessage()]
    for future in futures:
        with pytest.raises(errors.ClientClosedError):
            future.result(1)


def test_headers_must_be_pairs() -> None:
    normalize = normalize_headers
    assert normalize([("a", b"b"), ("c", "d"), ("e", None)]) == [("a", b"b"), ("c", b"d"), ("e", None)]
    assert normalize({"a": b"b"}) == [("a", b"b")]
    for bad in (["ab", "cd"], [("a", b"b", b"c")], [(1, b"b")], [("a", 5)]):
        with pytest.raises(TypeError, match="header"):
            normalize(bad)


def test_one_megabyte_record_with_default_settings(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    big = bytes(range(256)) * 4096  # 1 MiB, above the default batch_bytes_max of 256 KiB
    with Producer(cluster.bootstrap) as producer:
        small = producer.send(topic_name, b"small")
        meta = producer.send(topic_name, big, headers=[("h", b"v")]).result(30)
        assert small.result(30).offset == 0 and meta.offset == 1
        with pytest.raises(errors.MessageTooLargeError, match="message_bytes_max=8388608"):
            producer.send(topic_name, b"x" * (8 << 20))
    records = read_all(cluster.bootstrap, topic_name, 1, expected=2)
    assert [r.value for r in records] == [b"small", big]


def test_bootstrap_with_a_foreign_scheme_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="zk://HOST:PORT"):
        Producer("http://x")


def test_queue_send_options_arrive_as_documented_headers(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(cluster.bootstrap) as producer:
        producer.send(topic_name, b"q", headers=[("h", b"v")], delay_ms=1500, priority=7, dedup_id="d-1",
                      ttl_ms=60_000).result(30)
        with pytest.raises(errors.InvalidPriorityError):
            producer.send(topic_name, b"bad", priority=10)
    [record] = read_all(cluster.bootstrap, topic_name, 1, expected=1)
    assert list(record.headers) == [("h", b"v"), ("fabric.delay_ms", b"1500"), ("fabric.ttl_ms", b"60000"),
                                    ("fabric.priority", b"7"), ("fabric.dedup_id", b"d-1")]


def test_async_producer_takes_the_queue_send_options(cluster: LocalCluster, topic_name: str) -> None:
    import asyncio

    from sdk.aio import AsyncProducer

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)

    async def send() -> None:
        with Producer(cluster.bootstrap) as producer:
            await AsyncProducer(producer).send(topic_name, b"a", priority=3, delay_ms=10)

    asyncio.run(send())
    [record] = read_all(cluster.bootstrap, topic_name, 1, expected=1)
    assert list(record.headers) == [("fabric.delay_ms", b"10"), ("fabric.priority", b"3")]


def test_async_producer_sends_tags_and_header_lists(cluster: LocalCluster, topic_name: str) -> None:
    """AsyncProducer.send took no ``tags`` (an asyncio service could not feed a tag-filtered
    group) and was typed for dict headers only; both are Producer.send's now."""
    import asyncio

    from sdk import Consumer, TopicPartition
    from sdk.aio import AsyncProducer

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)

    async def send() -> None:
        with Producer(cluster.bootstrap) as producer:
            aio = AsyncProducer(producer)
            await aio.send(topic_name, b"plain", headers=[("h", b"1"), ("h", b"2")])
            await aio.send(topic_name, b"paid", tags=("paid", "eu"))

    asyncio.run(send())
    first, second = read_all(cluster.bootstrap, topic_name, 1, expected=2)
    assert list(first.headers) == [("h", b"1"), ("h", b"2")]
    assert list(second.headers) == [("fabric.tags", b"paid,eu")]
    with Consumer(cluster.bootstrap, tag_filter="paid") as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        consumer.seek_to_beginning()
        got = consumer.poll(timeout_ms=5_000)
    assert [r.value for r in got] == [b"paid"]


def test_flush_waits_for_batches_the_sender_is_still_encoding(cluster: LocalCluster, topic_name: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch the sender has taken from the accumulator but not yet put in flight (it is
    being compressed and sent) is still unanswered: flush() must wait for it."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    encoding = threading.Event()
    real_encode = _ProducerCore._encode

    def slow_encode(self: _ProducerCore, batch: Any) -> bytes:
        encoding.set()
        time.sleep(0.5)  # a large batch being compressed
        return real_encode(self, batch)

    monkeypatch.setattr(_ProducerCore, "_encode", slow_encode)
    with Producer(cluster.bootstrap, linger_ms=0) as producer:
        producer.partitions_for(topic_name)
        future = producer.send(topic_name, b"x")
        assert encoding.wait(10)  # the sender has the batch
        producer.flush(30)
        assert future.done()

"""Strict-order topics on real processes: 3 nodes, 2 sequencers, RF 3, acks=all."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from fabric import errors
from fabric.local import LocalCluster, LocalZooKeeper
from fabric.protocol import apis, batch
from fabric.protocol.apis import ApiKey
from nodes.strict_order import make_tick
from sdk import Admin, OrderedConsumer, Producer
from tests.conftest import make_cluster
from tests.integration.helpers import decode, leader_address, raw_request, read_all

PARTITIONS = 6
PRODUCERS = 4
PER_PRODUCER = 1_500


@pytest.fixture(scope="module")
def strict_cluster(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path_factory.mktemp("strict"), sequencer_count=2)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def produce_concurrently(bootstrap: str, topic: str) -> set[bytes]:
    sent: set[bytes] = set()
    lock = threading.Lock()
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            with Producer(bootstrap, linger_ms=2) as producer:
                futures = []
                for i in range(PER_PRODUCER):
                    value = b"p%d-%d" % (index, i)
                    futures.append(producer.send(topic, value, key=b"k%d" % (i % 50)))
                    with lock:
                        sent.add(value)
                for future in futures:
                    future.result(timeout=60)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(PRODUCERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    return sent


def read_ordered(bootstrap: str, topic: str, count: int, timeout_s: float = 60.0) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    with OrderedConsumer(bootstrap, topic) as consumer:
        deadline = time.monotonic() + timeout_s
        while len(out) < count and time.monotonic() < deadline:
            out.extend((r.global_id, r.value or b"") for r in consumer.poll(timeout_ms=500))
    return out


def test_four_producers_six_partitions_two_ordered_readers_agree(strict_cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, strict_order=True)
        assert admin.describe_topic(topic_name).configs["strict_order"] == "true"
    sent = produce_concurrently(bootstrap, topic_name)
    first = read_ordered(bootstrap, topic_name, len(sent))
    second = read_ordered(bootstrap, topic_name, len(sent))
    assert first == second, "two ordered readers saw different sequences"
    ids = [gid for gid, _ in first]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert {value for _, value in first} == sent and len(first) == len(sent)
    # A plain consumer sees every record once (ticks skipped), each with its global ID.
    plain = read_all(bootstrap, topic_name, PARTITIONS, expected=len(sent))
    assert len(plain) == len(sent) and {r.value for r in plain} == sent
    by_value = dict((value, gid) for gid, value in first)
    assert all(r.global_id == by_value[r.value] for r in plain)
    per_partition: dict[int, list[int]] = {}
    for r in plain:
        per_partition.setdefault(r.partition, []).append(r.global_id)
    assert all(gids == sorted(gids) for gids in per_partition.values()), "IDs must rise along each partition"


def test_idle_partitions_tick_so_a_single_record_is_delivered(strict_cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, strict_order=True)
    with Producer(bootstrap) as producer:
        producer.send(topic_name, b"only", partition=2).result(timeout=30)
    assert [value for _gid, value in read_ordered(bootstrap, topic_name, 1, timeout_s=30)] == [b"only"]


def test_forged_ids_and_control_batches_are_refused_and_the_node_keeps_serving(
        strict_cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, strict_order=True)
    address = leader_address(bootstrap, topic_name)
    forged = batch.encode_batch([1], [None], [b"forged"], global_id_base=12345)
    cases = [(forged, errors.InvalidGlobalIdError.code), (bytes(make_tick(1)), errors.InvalidRequestError.code)]
    for frame, code in cases:
        request = apis.encode_request(ApiKey.PRODUCE, {"acks": -1, "timeout_ms": 10_000,
                                                       "entries": [{"topic": topic_name, "partition": 0}]}, 7,
                                      batches=[frame])
        result = decode(raw_request(address, request)).body["results"][0]
        assert result["error"] == code, result
    with Producer(bootstrap) as producer:
        meta = producer.send(topic_name, b"after", partition=0).result(timeout=30)
    assert meta.offset >= 0
    records = read_ordered(bootstrap, topic_name, 1, timeout_s=30)
    assert [value for _gid, value in records] == [b"after"]


def test_a_normal_topic_refuses_an_ordered_reader(strict_cluster: LocalCluster, topic_name: str) -> None:
    with Admin(strict_cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with pytest.raises(errors.InvalidRequestError):
        OrderedConsumer(strict_cluster.bootstrap, topic_name)


def test_an_ordered_reader_refuses_to_pause_a_partition(strict_cluster: LocalCluster, topic_name: str) -> None:
    # One paused partition would hold the watermark, and so every partition (sdk/ordered.py).
    with Admin(strict_cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, strict_order=True)
    with OrderedConsumer(strict_cluster.bootstrap, topic_name) as reader:
        assert not hasattr(reader, "pause")
        with pytest.raises(errors.InvalidRequestError, match="OrderedConsumer"):
            reader.consumer.pause(reader.partitions[0])
        assert reader.consumer.paused() == set()


def test_a_strict_order_topic_keeps_its_partition_count(strict_cluster: LocalCluster, topic_name: str) -> None:
    # An open ordered reader skipped the records of partitions added after it started (and
    # a late one would sit below IDs already delivered): growth is refused instead.
    with Admin(strict_cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, strict_order=True)
        with pytest.raises(errors.InvalidPartitionsError, match="strict-order"):
            admin.create_partitions(topic_name, 4)
        assert len(admin.describe_topic(topic_name).partitions) == 2


def test_the_strict_order_flag_in_the_cli(strict_cluster: LocalCluster, topic_name: str) -> None:
    import subprocess
    import sys

    # A child process: the CLI quiets library loggers process-wide, which other tests see.
    run = subprocess.run([sys.executable, "-m", "fabric", "topic", "create", topic_name, "--partitions", "2",
                          "--strict-order", "--bootstrap", strict_cluster.bootstrap],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "(strict order)" in run.stdout
    with Admin(strict_cluster.bootstrap) as admin:
        assert admin.describe_topic(topic_name).configs["strict_order"] == "true"


def test_a_plain_consumer_reaches_the_end_offsets_past_ticks(strict_cluster: LocalCluster, topic_name: str) -> None:
    """Ticks take offsets; a reader that stops at the end offsets must still get there."""
    from sdk import Consumer, TopicPartition

    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, strict_order=True)
    with Producer(bootstrap) as producer:
        producer.send(topic_name, b"one", partition=0).result(timeout=30)
    time.sleep(0.5)  # idle: both partitions tick
    with Consumer(bootstrap) as consumer:
        tps = consumer.subscribe_all_partitions(topic_name)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        assert ends[TopicPartition(topic_name, 1)] > 0, "an idle partition should hold ticks"
        values = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "the position never passed the ticks"
            values.extend(r.value for r in consumer.poll(timeout_ms=200))
    assert values == [b"one"]


def test_a_plain_consumer_reaches_the_end_offsets_past_a_tick_fetched_with_records(
        strict_cluster: LocalCluster, topic_name: str) -> None:
    """A partition whose records are followed by a tick ([record, tick]: a record with a
    higher ID went to another partition), fetched in one answer: the tick arrived while the
    record still waited for the caller, was skipped without moving the position, and the
    position stopped one short of the end offset for good (a soak's read-to-the-end loop
    timed out on a strict-order topic)."""
    from sdk import Consumer, TopicPartition

    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, strict_order=True)
    with Producer(bootstrap) as producer:
        producer.send(topic_name, b"one", partition=0).result(timeout=30)
        producer.send(topic_name, b"two", partition=1).result(timeout=30)
    first = TopicPartition(topic_name, 0)
    with Consumer(bootstrap) as consumer:
        tps = consumer.subscribe_all_partitions(topic_name)
        deadline = time.monotonic() + 30
        while consumer.end_offsets([first])[first] < 2:  # partition 0 ticks once, to pass "two"
            assert time.monotonic() < deadline, "partition 0 never ticked"
            time.sleep(0.1)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        values = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, (
                f"positions {[consumer.position(tp) for tp in tps]} never reached the end offsets {list(ends.values())}")
            values.extend(r.value for r in consumer.poll(timeout_ms=200))
    assert sorted(values) == [b"one", b"two"]


def test_an_idle_topic_stops_ticking(strict_cluster: LocalCluster, topic_name: str) -> None:
    """Ticks only while a record elsewhere has a higher ID: an idle topic's logs stay still."""
    from sdk import Consumer

    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, strict_order=True)
    with Producer(bootstrap) as producer:
        producer.send(topic_name, b"last words", partition=0).result(timeout=30)
    with Consumer(bootstrap) as consumer:
        tps = consumer.subscribe_all_partitions(topic_name)
        time.sleep(1.0)  # every other partition ticks once, to pass the record
        before = consumer.end_offsets(tps)
        time.sleep(1.0)
        after = consumer.end_offsets(tps)
    assert before == after, f"idle partitions kept ticking: {before} -> {after}"
    assert sum(after.values()) <= 2 * PARTITIONS


def test_a_paused_sequencer_does_not_hold_up_the_nodes_other_requests(
        strict_cluster: LocalCluster, topic_name: str) -> None:
    """A strict-order produce waits for its grant off the node's loop (nodes/strict_grants.py):
    with the sequencer paused, a request sent after it on the same connection is answered
    first. (The loop used to wait up to 500 ms inside the grant, again and again while the
    sequencer was paused, and plain topics on the node waited with it.)"""
    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, strict_order=True)
    with Producer(bootstrap) as producer:  # the leader has asked its sequencer before
        producer.send(topic_name, b"first", partition=0).result(timeout=30)
    address = leader_address(bootstrap, topic_name)
    produce = apis.encode_request(ApiKey.PRODUCE, {"acks": -1, "timeout_ms": 10_000,
                                                   "entries": [{"topic": topic_name, "partition": 0}]}, 1,
                                  batches=[batch.encode_batch([1], [None], [b"waits"])])
    metadata = apis.encode_request(ApiKey.METADATA, {"topics": [topic_name]}, 2)
    sequencer = strict_cluster.sequencers[strict_cluster.wait_for_active_sequencer()]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    answered: list[int] = []
    sequencer.pause()
    try:
        sock.send_multipart(produce)
        sock.send_multipart(metadata)
        while len(answered) < 2:
            assert sock.poll(30_000), f"answers so far: {answered}"
            answered.append(decode(sock.recv_multipart()).header.correlation_id)
    finally:
        sequencer.resume()
        sock.close(linger=0)
    assert answered == [2, 1]  # METADATA first; the produce when its grant came back or failed
    strict_cluster.wait_for_active_sequencer()


def test_the_throughput_benchmark_counts_records_not_ticks(strict_cluster: LocalCluster, topic_name: str) -> None:
    """``python3 -m bench.strict_order`` (README) stopped at its first strict-order run, "took
    N records, M were sent": bench.replication's check that every record sent is in the log
    compared end offsets, which the leaders' ticks move too. Fast ticks make some certain."""
    from bench.replication import PARTITIONS as BENCH_PARTITIONS
    from bench.replication import throughput

    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=BENCH_PARTITIONS, strict_order=True,
                           config={"strict_order_tick_ms": 10})
    assert throughput(bootstrap, topic_name, 20_000, "all") > 0

"""Ordered readers that start at the end of a strict-order topic being written."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, OrderedConsumer, Producer
from tests.conftest import make_cluster

PARTITIONS = 4
PRODUCERS = 3
LATE_READERS = 4
READ_S = 1.0  # each late reader reads this long before the next one starts
QUIET_POLLS_MAX = 4  # a reader is done after this many empty polls of 500 ms in a row
CATCH_UP_S = 30.0  # a late reader must reach the end of the order within this


@pytest.fixture(scope="module")
def strict_cluster(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path_factory.mktemp("strict-reader"), sequencer_count=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def drain(reader: OrderedConsumer, into: list[int]) -> None:
    quiet = 0
    while quiet < QUIET_POLLS_MAX:
        records = reader.poll(timeout_ms=500)
        into.extend(r.global_id for r in records)
        quiet = 0 if records else quiet + 1


def test_a_reader_started_at_the_end_sees_a_suffix_of_the_order_without_holes(
        strict_cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, strict_order=True)
    stop = threading.Event()
    failures: list[BaseException] = []

    def produce(index: int) -> None:
        try:
            with Producer(bootstrap, linger_ms=1) as producer:
                sent = 0
                while not stop.is_set():
                    futures = [producer.send(topic_name, b"%d:%d" % (index, sent + i), partition=(sent + i) % PARTITIONS)
                               for i in range(20)]
                    sent += len(futures)
                    for future in futures:
                        future.result(timeout=30)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    late: list[tuple[OrderedConsumer, list[int]]] = []
    try:
        time.sleep(READ_S)
        for _ in range(LATE_READERS):
            # Started while every partition is being written: before the fix each one
            # skipped 20-40 records committed between its partitions' end-offset lookups
            # and delivered later ones around them.
            reader = OrderedConsumer(bootstrap, topic_name, from_beginning=False)
            ids: list[int] = []
            late.append((reader, ids))
            deadline = time.monotonic() + READ_S
            while time.monotonic() < deadline:
                ids.extend(r.global_id for r in reader.poll(timeout_ms=200))
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        assert not failures, failures
        everything: list[int] = []
        with OrderedConsumer(bootstrap, topic_name) as reader:
            drain(reader, everything)
        # Each late reader reads on until it has the last record of the order (no quiet
        # polls to wait out: the end is known now).
        for reader, ids in late:
            deadline = time.monotonic() + CATCH_UP_S
            while (not ids or ids[-1] != everything[-1]) and time.monotonic() < deadline:
                ids.extend(r.global_id for r in reader.poll(timeout_ms=200))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        for reader, _ids in late:
            reader.close()
    for number, (_reader, ids) in enumerate(late):
        assert ids, f"late reader {number} read nothing"
        start = everything.index(ids[0])
        assert ids == everything[start:], (
            f"late reader {number}: {len(ids)} records from index {start} of {len(everything)}, "
            f"{len(everything) - start - len(ids)} missing")


def test_a_reader_started_at_the_end_of_a_quiet_topic_gets_only_what_follows(
        strict_cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, strict_order=True)
    with Producer(bootstrap) as producer:
        for i in range(10):  # partition 3 stays empty: it is started at offset 0
            producer.send(topic_name, b"before-%d" % i, partition=i % (PARTITIONS - 1))
        producer.flush()
        with OrderedConsumer(bootstrap, topic_name, from_beginning=False) as reader:
            assert reader.poll(timeout_ms=1_000) == []
            for i in range(8):
                producer.send(topic_name, b"after-%d" % i, partition=i % PARTITIONS).result(timeout=10)
            values: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(values) < 8 and time.monotonic() < deadline:
                values.extend(r.value or b"" for r in reader.poll(timeout_ms=500))
    assert values == [b"after-%d" % i for i in range(8)]


def test_fabric_consume_ordered_prints_the_total_order(strict_cluster: LocalCluster, topic_name: str) -> None:
    """`fabric consume T --ordered --print-global-id` prints every record of a strict-order
    topic once, in global-ID order across its partitions, then stops once quiet; the flags
    that make no sense with it are one usage line (exit 2)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    bootstrap = strict_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, strict_order=True)
    with Producer(bootstrap, linger_ms=1) as producer:
        futures = [producer.send(topic_name, b"v%d" % i, partition=i % PARTITIONS) for i in range(200)]
        for future in futures:
            future.result(timeout=30)
    done = subprocess.run([sys.executable, "-m", "fabric", "consume", topic_name, "--bootstrap", bootstrap,
                           "--ordered", "--print-global-id", "--print-offset"],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line.split("\t") for line in done.stdout.splitlines()]
    ids = [int(fields[0]) for fields in lines]
    assert len(lines) == 200 and ids == sorted(ids) and len(set(ids)) == 200
    assert sorted(fields[2] for fields in lines) == sorted(f"v{i}" for i in range(200))
    for flags in (["--partition", "0"], ["--from-offset", "5"], ["--group", "g"]):
        refused = subprocess.run([sys.executable, "-m", "fabric", "consume", topic_name, "--bootstrap", bootstrap,
                                  "--ordered", *flags], capture_output=True, text=True, timeout=60, env=env, check=False)
        assert refused.returncode == 2 and "--ordered" in refused.stderr and "Traceback" not in refused.stderr, flags

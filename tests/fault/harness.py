"""Workloads and fault helpers for the fault tests: real processes, seeded choices."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalCluster, LocalZooKeeper
from nodes.log import Store
from sdk import Admin, Consumer, Producer, TopicPartition
from tests.conftest import make_cluster
from tests.fault.history import History, check

WAIT_S = 60.0
# Followers out of the ISR after 1.5 s of lag: failovers and recoveries happen within a test.
NODE_ARGS = ["--replica-lag-max-ms", "1500"]


def seed_from_env() -> int:
    """FABRIC_FAULT_SEED reproduces a run; otherwise a fresh seed (printed by the test)."""
    raw = os.environ.get("FABRIC_FAULT_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


class Writer(threading.Thread):
    """Sends unique values at a steady rate with acks=all and idempotence, recording the outcome."""

    def __init__(self, bootstrap: str, topic: str, history: History, count: int, rate_per_s: float,
                 name: str = "w", **producer_args: Any) -> None:
        super().__init__(name=f"writer-{name}", daemon=True)
        self.producer = Producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=2,
                                 delivery_timeout_ms=180_000, request_timeout_ms=10_000, **producer_args)
        self.topic = topic
        self.history = history
        self.count = count
        self.rate_per_s = rate_per_s
        self.label = name
        self.sent = 0
        self.ack_times: dict[int, list[float]] = {}  # partition -> monotonic times of acks
        # partition -> (sent, acknowledged) of each write: failover time counts only writes
        # sent after a kill, which only the new leader can acknowledge.
        self.sent_and_acked: dict[int, list[tuple[float, float]]] = {}
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            started = time.monotonic()
            for i in range(self.count):
                if self.stop_flag.is_set():
                    break
                value = f"{self.label}-{i}".encode()
                self.history.record_sent(value)
                future = self.producer.send(self.topic, value, key=b"k%d" % (i % 97))
                future.add_callback(self._callback(value, time.monotonic()))
                self.sent += 1
                ahead = self.sent / self.rate_per_s - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            self.producer.flush(timeout=180)
        except BaseException as exc:  # surfaced by the test through .error
            self.error = exc
        finally:
            self.producer.close(timeout=30)

    def _callback(self, value: bytes, sent: float) -> Any:
        def done(meta: Any, exc: BaseException | None) -> None:
            if exc is None:
                now = time.monotonic()
                self.history.record_ack(value, meta.partition, meta.offset)
                self.ack_times.setdefault(meta.partition, []).append(now)
                self.sent_and_acked.setdefault(meta.partition, []).append((sent, now))
            else:
                self.history.record_failure(value, exc)
        return done


class Reader(threading.Thread):
    """Consumes every partition while faults happen, recording what it sees."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, history: History, name: str = "live") -> None:
        super().__init__(name=f"reader-{name}", daemon=True)
        self.consumer = Consumer(bootstrap, fetch_max_wait_ms=200)
        self.consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        self.consumer.seek_to_beginning()
        self.history = history
        self.label = name
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                for record in self.consumer.poll(timeout_ms=200):
                    self.history.record_read(self.label, record.partition, record.offset, record.value or b"")
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()


def read_everything(bootstrap: str, topic: str, partitions: int, history: History, reader: str = "final") -> None:
    """After healing: read each partition from its start to its high watermark."""
    with Consumer(bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read up to {ends}")
            for record in consumer.poll(timeout_ms=500):
                if record.offset < ends[TopicPartition(record.topic, record.partition)]:
                    history.record_read(reader, record.partition, record.offset, record.value or b"")


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    with Admin(bootstrap) as admin:
        return admin.describe_topic(topic).partitions[partition].leader


def describe(bootstrap: str, topic: str) -> Any:
    with Admin(bootstrap) as admin:
        return admin.describe_topic(topic)


def wait_until(condition: Any, what: str, timeout_s: float = WAIT_S, interval_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except errors.FabricError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval_s)


def full_isr_on_every_node(bootstrap: str, topic: str) -> bool:
    """Every replica's node is live, and every live node's view of ``topic`` shows a leader
    and a full ISR on each partition, all agreeing on leader and epoch. Asking one node is
    not enough: a node cut off from ZooKeeper answers from its last map, which can show an
    ISR that has since shrunk. Nor is asking the live nodes while a replica's node is not
    registered (after a lost session it registers again): the one node asked could still
    show the full ISR it is about to shrink."""
    with Admin(bootstrap) as admin:
        live = admin.nodes()
    views = []
    for address in live.values():
        with Admin(address) as one:
            views.append(tuple((p.leader, p.leader_epoch, frozenset(p.isr), frozenset(p.replicas))
                               for p in one.describe_topic(topic).partitions))
    return bool(views) and len(set(views)) == 1 and all(
        leader >= 0 and isr == replicas and replicas <= live.keys() for leader, _, isr, replicas in views[0])


def wait_for_full_isr(bootstrap: str, topic: str, timeout_s: float = WAIT_S) -> None:
    wait_until(lambda: full_isr_on_every_node(bootstrap, topic), f"every replica of {topic} in sync on every node",
               timeout_s)


def collect_replicas(cluster: LocalCluster, topic: str, partitions: int, history: History) -> None:
    """Stop every node cleanly and read each one's stored batches straight from RocksDB."""
    for node in cluster.nodes.values():
        node.stop()
    for node_id, node in cluster.nodes.items():
        store = Store(str(Path(node.data_dir) / "rocksdb"))
        try:
            by_partition: dict[int, dict[int, bytes]] = {}
            for p in range(partitions):
                batches = store.stored_batches(topic, p)
                if batches:
                    by_partition[p] = batches
            history.replicas[node_id] = by_partition
        finally:
            store.close()


def expire_session(zk_address: str, data_dir: Path) -> None:
    """Expire a node's ZooKeeper session from outside, as kazoo's test harness does: join
    the session with its id and password, then close it."""
    info = json.loads((data_dir / "zk_session.json").read_text())
    session = (int(info["session_id"], 16), bytes.fromhex(info["password"]))
    hijack = KazooClient(hosts=zk_address, client_id=session)
    hijack.start(timeout=10)
    zkl.close_client(hijack)


def create_replicated_topic(bootstrap: str, topic: str, partitions: int) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=3, config={"min_insync": 2})


LOG_DIR = Path("/tmp/fabric-fault-logs")


def keep_logs(cluster: LocalCluster, test_name: str) -> None:
    """Copy the node logs where the next run will not delete them (pytest keeps only the
    last three temp dirs), so a failure can be read after the fact."""
    target = LOG_DIR / test_name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True, exist_ok=True)
    for log_file in cluster.base_dir.glob("*.log"):
        shutil.copy(log_file, target / log_file.name)
    print(f"node logs: {target}")


@contextmanager
def running_cluster(zk_server: LocalZooKeeper, base_dir: Path, test_name: str, session_timeout_ms: int,
                    **kwargs: Any) -> Iterator[LocalCluster]:
    """Three nodes with the fault tests' node arguments on the session's ZooKeeper, started;
    afterwards, also on failure, paused nodes resumed (a SIGSTOPped node cannot be stopped
    politely), the cluster stopped and its logs kept."""
    cluster = make_cluster(zk_server, base_dir, session_timeout_ms=session_timeout_ms, node_args=NODE_ARGS, **kwargs)
    cluster.start()
    try:
        yield cluster
    finally:
        for node in cluster.nodes.values():
            if node.process.running:
                node.resume()
        cluster.stop()
        keep_logs(cluster, test_name)


def start_workload(bootstrap: str, topic: str, partitions: int, rate_per_s: float) -> tuple[History, Writer, Reader]:
    """One acks=all idempotent writer at a steady rate and one live reader, both running."""
    history = History()
    writer = Writer(bootstrap, topic, history, count=10**9, rate_per_s=rate_per_s)
    reader = Reader(bootstrap, topic, partitions, history)
    writer.start()
    reader.start()
    return history, writer, reader


def finish(cluster: LocalCluster, topic: str, partitions: int, history: History, seed: int,
           writers: list[Writer], readers: list[Reader]) -> None:
    """Stop the workload, heal, read everything, compare replicas, and judge."""
    for writer in writers:
        writer.stop_flag.set()
    for writer in writers:
        writer.join(timeout=240)
        assert not writer.is_alive(), f"writer did not finish (seed={seed})"
        assert writer.error is None, f"writer failed: {writer.error!r} (seed={seed})"
    for node in cluster.nodes.values():
        if not node.process.running:
            node.start()
    cluster.wait_for_nodes(list(cluster.nodes))
    wait_for_full_isr(cluster.bootstrap, topic)
    read_everything(cluster.bootstrap, topic, partitions, history)
    for reader in readers:
        reader.stop_flag.set()
        reader.join(timeout=30)
        assert reader.error is None, f"reader failed: {reader.error!r} (seed={seed})"
    time.sleep(1.0)  # followers ack their last batches
    collect_replicas(cluster, topic, partitions, history)
    report = check(history)
    print(f"seed={seed}: {report.summary()}")
    assert report.ok(), f"reproduce with FABRIC_FAULT_SEED={seed}: {report.summary()}"


def producer_diagnostics(writer: Writer) -> str:
    """What a stuck writer's producer holds (for a failing test's message only)."""
    producer = writer.producer
    now = time.monotonic()
    queued = {f"{tp[0]}/{tp[1]}": (len(q), q[0].attempts, repr(q[0].last_error)[:160])
              for tp, q in producer._acc.batches.items() if q}
    flights = [(f.address, round(now - f.sent_s, 1), sorted({b.partition for b in f.batches}))
               for f in producer._in_flight.values()]
    return (f"writer sent {writer.sent}, failures {len(writer.history.failed)} "
            f"{list(writer.history.failed.values())[:3]}; queued batches (count, first's attempts and last error) "
            f"{queued}; in flight {flights}; "
            f"producer id {producer.producer_id}")

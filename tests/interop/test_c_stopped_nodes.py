"""The C producer's time bounds against real nodes that are stopped (SIGSTOP): a stopped
node still accepts TCP connections (the kernel does) and never answers.

* A METADATA refresh that asked a stopped node first waited the whole 5 s for it while
  nothing else progressed; its first pass now gives each node 500 ms (as the Python SDK,
  sdk/_client.py METADATA_QUICK_ANSWER_MS).
* With every node stopped, a record failed with DELIVERY_TIMEOUT only after about 11 s
  for a delivery_timeout_ms of 2 s: the turn that fails expired batches sat in a refresh of
  each node in turn. The refresh is now bounded by the earliest delivery deadline.

The C producer is not idempotent (no producer id, no sequence numbers), so a batch lost
to a delivery timeout leaves no gap for the node to refuse later batches over: the
records sent after it are taken (checked here too).
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster
from sdk import Admin, Consumer, TopicPartition
from tests.interop.conftest import CClient

pytestmark = pytest.mark.interop

REQUEST_TIMEOUT_MS = 1_000
DELIVERY_TIMEOUT_MS = 2_000
# Nodes stay stopped for less than the cluster's ZooKeeper session timeout (6 s), so they
# come back as they were (no failover in between).
PAUSE_S_MAX = 4.5
LINE_TIMEOUT_S = 60.0

# Commands on stdin, results on stdout:
#   send TOPIC PARTITION VALUE FLUSH_MS -> "delivered ERROR OFFSET MS" (from the delivery
#       callback, MS after fabric_produce was called), then "flushed RESULT MS"
#   spread TOPIC P1,P2,... VALUE POLL_MS -> one record to each partition, then
#       fabric_producer_poll(POLL_MS) until nothing is pending: a "delivered ..." line per
#       batch, then "polled LONGEST_POLL_MS MS"
#   count TOPIC -> "count RESULT N MS" (fabric_producer_partition_count: a METADATA refresh
#       for a topic the producer has not used yet)
_DRIVER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fabric.h>

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long long sent_at;

static void on_delivery(const fabric_delivery_t *d, void *opaque) {
    (void)opaque;
    printf("delivered %s %lld %lld\n", d->error ? fabric_err_name(d->error) : "OK",
           (long long)d->base_offset, now_ms() - sent_at);
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    fabric_producer_config_t cfg;
    fabric_producer_config_init(&cfg);
    cfg.linger_ms = 0;
    cfg.request_timeout_ms = atoi(argv[2]);
    cfg.delivery_timeout_ms = atoi(argv[3]);
    cfg.on_delivery = on_delivery;
    fabric_producer_t *p;
    if (fabric_producer_new(&p, argv[1], &cfg)) return 1;
    char line[1024], topic[256], value[256], parts[256];
    int partition, flush_ms, poll_ms;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "send %255s %d %255s %d", topic, &partition, value, &flush_ms) == 4) {
            sent_at = now_ms();
            int rc = fabric_produce(p, topic, partition, NULL, -1, value, (int32_t)strlen(value), NULL, 0, -1);
            if (rc == 0) rc = fabric_producer_flush(p, flush_ms);
            else printf("delivered %s -1 %lld\n", fabric_err_name(rc), now_ms() - sent_at);
            printf("flushed %s %lld\n", rc ? fabric_err_name(rc) : "OK", now_ms() - sent_at);
        } else if (sscanf(line, "spread %255s %255s %255s %d", topic, parts, value, &poll_ms) == 4) {
            sent_at = now_ms();
            for (char *at = strtok(parts, ","); at != NULL; at = strtok(NULL, ","))
                if (fabric_produce(p, topic, atoi(at), NULL, -1, value, (int32_t)strlen(value), NULL, 0, -1)) return 1;
            long long longest = 0;
            while (fabric_producer_next_timeout_ms(p) >= 0) {
                long long began = now_ms();
                fabric_producer_poll(p, poll_ms);
                if (now_ms() - began > longest) longest = now_ms() - began;
            }
            printf("polled %lld %lld\n", longest, now_ms() - sent_at);
        } else if (sscanf(line, "count %255s", topic) == 1) {
            int32_t n = -1;
            long long began = now_ms();
            int rc = fabric_producer_partition_count(p, topic, &n);
            printf("count %s %d %lld\n", rc ? fabric_err_name(rc) : "OK", n, now_ms() - began);
        } else {
            break;
        }
    }
    fabric_producer_destroy(p);
    return 0;
}
"""


class Driver:
    """The driver program, its output read by a thread (so that a wait can be bounded)."""

    def __init__(self, binary: Path, bootstrap: str) -> None:
        self.proc = subprocess.Popen([str(binary), bootstrap, str(REQUEST_TIMEOUT_MS), str(DELIVERY_TIMEOUT_MS)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[list[str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.split())

    def command(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def line(self, timeout_s: float = LINE_TIMEOUT_S) -> list[str] | None:
        try:
            return self.lines.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def send(self, topic: str, partition: int, value: str) -> tuple[list[str] | None, list[str] | None]:
        self.command(f"send {topic} {partition} {value} 30000")
        return self.line(), self.line()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def driver_binary(c_client: CClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("c-stopped-nodes")
    source, binary = work / "driver.c", work / "driver"
    source.write_text(_DRIVER_C)
    subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", *c_client.cflags, f"-I{c_client.root}", str(source),
                    str(c_client.static_lib), "-lzmq", "-llz4", "-lz", "-o", str(binary)],
                   check=True, timeout=120)
    return binary


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(cluster.bootstrap) as client:
        yield client


def _bootstrap(admin: Admin) -> str:
    return ",".join(address for _, address in sorted(admin.nodes().items()))


def test_c_metadata_refresh_does_not_wait_5s_for_a_stopped_node(driver_binary: Path, cluster: LocalCluster,
                                                                 admin: Admin, topic_name: str) -> None:
    """METADATA lists the nodes by id, and the producer asks the known nodes in that order:
    node 1 first, on the control connection it opened at the start. With node 1 stopped,
    a refresh (here for a topic not used yet) waited 5 s for it, and the producer did
    nothing else meanwhile; now 0.5 s."""
    first = min(admin.nodes())
    admin.create_topic(topic_name, partitions=3, replication_factor=1)
    admin.create_topic(f"{topic_name}-b", partitions=2, replication_factor=1)
    partition = next(p.partition for p in admin.describe_topic(topic_name).partitions if p.leader != first)
    driver = Driver(driver_binary, _bootstrap(admin))
    try:
        delivered, _flushed = driver.send(topic_name, partition, "warm")
        assert delivered is not None and delivered[:3] == ["delivered", "OK", "0"], delivered
        cluster.nodes[first].pause()
        try:
            driver.command(f"count {topic_name}-b")
            counted = driver.line(PAUSE_S_MAX)
        finally:
            cluster.nodes[first].resume()
        assert counted is not None, "the refresh took longer than the pause"
        assert counted[:3] == ["count", "OK", "2"], counted
        assert int(counted[3]) < 2_000, f"the refresh waited {counted[3]} ms for the stopped node (was 5 s)"
    finally:
        driver.close()


def test_c_delivery_timeout_holds_while_every_node_is_stopped(driver_binary: Path, cluster: LocalCluster,
                                                               admin: Admin, topic_name: str) -> None:
    """A record sent while every node is stopped fails with DELIVERY_TIMEOUT at about
    delivery_timeout_ms (it took about 11 s for 2 s); the records sent once the nodes are
    back are taken at the next offsets, as the C producer has no sequence numbers to leave
    a gap in."""
    admin.create_topic(topic_name, partitions=1, replication_factor=3)
    driver = Driver(driver_binary, _bootstrap(admin))
    try:
        delivered, flushed = driver.send(topic_name, 0, "warm")
        assert delivered is not None and delivered[:3] == ["delivered", "OK", "0"], delivered
        for node in cluster.nodes.values():
            node.pause()
        try:
            driver.command(f"send {topic_name} 0 never-answered 30000")
            lost = driver.line(PAUSE_S_MAX)
        finally:
            for node in cluster.nodes.values():
                node.resume()
        assert lost is not None, f"no delivery report within {PAUSE_S_MAX} s (delivery_timeout_ms={DELIVERY_TIMEOUT_MS})"
        assert lost[:2] == ["delivered", "DELIVERY_TIMEOUT"], lost
        assert int(lost[3]) < DELIVERY_TIMEOUT_MS + 1_500, lost
        flushed = driver.line()
        assert flushed is not None and flushed[:2] == ["flushed", "OK"], flushed
        offsets = []
        for i in range(3):
            delivered, flushed = driver.send(topic_name, 0, f"after-{i}")
            assert delivered is not None and delivered[:2] == ["delivered", "OK"], delivered
            offsets.append(int(delivered[2]))
    finally:
        driver.close()
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        consumer.seek_to_beginning()
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = [r.value for r in consumer.poll(timeout_ms=1_000) if r.value is not None]
            values += got
            if not got and len(values) >= 4:
                break
    # The stopped leader may have taken the unanswered request after all: then it is there once.
    assert values in ([b"warm", b"after-0", b"after-1", b"after-2"],
                      [b"warm", b"never-answered", b"after-0", b"after-1", b"after-2"]), values
    assert offsets == list(range(len(values) - 3, len(values)))


def test_c_delivery_timeout_holds_with_every_leader_stopped(driver_binary: Path, cluster: LocalCluster,
                                                             admin: Admin, topic_name: str) -> None:
    """Records to three partitions, each led by another node, all three stopped, the
    application calling fabric_producer_poll(p, 50) (an idle loop): each record is failed
    with DELIVERY_TIMEOUT at about delivery_timeout_ms. A send to a node with no connection
    waited 1 s of its own, for each leader in turn and twice a turn, and a batch past its
    deadline by then was requeued rather than failed: the reports came 2.5 s late (4.5 s for
    2 s), and one poll of 50 ms took over 3 s."""
    admin.create_topic(topic_name, partitions=6, replication_factor=1)
    leaders: dict[int, int] = {}
    for p in admin.describe_topic(topic_name).partitions:
        leaders.setdefault(p.leader, p.partition)
    assert len(leaders) == len(cluster.nodes), f"partitions not led by every node: {leaders}"
    parts = ",".join(str(p) for p in sorted(leaders.values()))
    driver = Driver(driver_binary, _bootstrap(admin))
    try:
        driver.command(f"spread {topic_name} {parts} warm 50")
        warm = [driver.line() for _ in range(len(leaders) + 1)]
        assert [line[:2] if line else None for line in warm[:-1]] == [["delivered", "OK"]] * len(leaders), warm
        for node in cluster.nodes.values():
            node.pause()
        try:
            driver.command(f"spread {topic_name} {parts} never-answered 50")
            lost = [driver.line(PAUSE_S_MAX) for _ in leaders]
        finally:
            for node in cluster.nodes.values():
                node.resume()
        assert all(line is not None for line in lost), \
            f"not every record reported within {PAUSE_S_MAX} s (delivery_timeout_ms={DELIVERY_TIMEOUT_MS}): {lost}"
        for line in lost:
            assert line is not None and line[:2] == ["delivered", "DELIVERY_TIMEOUT"], lost
            assert int(line[3]) < DELIVERY_TIMEOUT_MS + 1_500, lost
        polled = driver.line()
        assert polled is not None and polled[0] == "polled", polled
    finally:
        driver.close()

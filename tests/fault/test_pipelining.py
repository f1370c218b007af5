"""Pipelining under failure: kill a leader while every partition it leads has
``max_in_flight`` (5) batches in flight; the checker finds nothing lost, duplicated,
reordered by a reader, or out of the producer's send order.

The leader is paused first (SIGSTOP) so that the producer fills its five slots per
partition with requests that get no answer, then killed (SIGKILL): the new leader has
some prefix of those batches, and the producer must resend the rest, in sequence order,
without writing any of them twice. Seeded: FABRIC_FAULT_SEED=<seed> reproduces a run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from tests.conftest import make_cluster
from tests.fault.harness import (
    NODE_ARGS,
    Reader,
    Writer,
    create_replicated_topic,
    finish,
    keep_logs,
    leader_of,
    wait_for_full_isr,
    wait_until,
)
from tests.fault.history import History, producer_order

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 2_000
PARTITIONS = 4
ROUNDS = 3
MAX_IN_FLIGHT = 5


@pytest.fixture
def pipelining_cluster(zk_server: LocalZooKeeper, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path / "cluster", session_timeout_ms=SESSION_TIMEOUT_MS, node_args=NODE_ARGS)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        keep_logs(cluster, request.node.name)


def test_kill_leader_with_five_batches_in_flight(pipelining_cluster: LocalCluster, seed: int) -> None:
    rng = random.Random(seed)
    cluster = pipelining_cluster
    bootstrap, topic = cluster.bootstrap, "pipelined"
    create_replicated_topic(bootstrap, topic, PARTITIONS)
    history = History()
    # Small batches and no linger: many batches per partition, so the slots fill at once.
    writer = Writer(bootstrap, topic, history, count=10**9, rate_per_s=4_000, name="p",
                    max_in_flight=MAX_IN_FLIGHT, batch_bytes_max=512)
    assert writer.producer.max_in_flight == MAX_IN_FLIGHT
    reader = Reader(bootstrap, topic, PARTITIONS, history)
    writer.start()
    reader.start()
    producer = writer.producer
    full_at_kill: list[int] = []
    for round_ in range(ROUNDS):
        wait_until(lambda r=round_: len(history.acked) > 2_000 * (r + 1), "steady acknowledged writes")
        partition = rng.randrange(PARTITIONS)
        victim = leader_of(bootstrap, topic, partition)
        led = [p for p in range(PARTITIONS) if leader_of(bootstrap, topic, p) == victim]
        cluster.nodes[victim].pause()
        try:
            # Requests to the paused leader get no answer: the producer sends up to
            # max_in_flight batches per partition, then waits.
            wait_until(lambda p=partition: producer._in_flight_slots.get((topic, p), 0) >= MAX_IN_FLIGHT,
                       f"{MAX_IN_FLIGHT} batches of partition {partition} in flight", timeout_s=20, interval_s=0.01)
            full_at_kill.append(sum(producer._in_flight_slots.get((topic, p), 0) >= MAX_IN_FLIGHT for p in led))
        finally:
            cluster.nodes[victim].kill()
        print(f"round {round_}: killed node {victim} (leader of {led}) with {MAX_IN_FLIGHT} batches in flight "
              f"on {full_at_kill[-1]} of them", flush=True)
        killed_at = time.monotonic()
        wait_until(lambda p=partition, v=victim: leader_of(bootstrap, topic, p) not in (v, -1), "a new leader")
        wait_until(lambda p=partition, t=killed_at: any(s > t for s, _a in writer.sent_and_acked.get(p, [])),
                   "an acknowledged write sent after the kill")
        cluster.nodes[victim].start()
        cluster.wait_for_nodes([victim])
        wait_for_full_isr(bootstrap, topic)
    finish(cluster, topic, PARTITIONS, history, seed, [writer], [reader])
    assert not history.failed, f"writes failed: {list(history.failed.items())[:5]}"
    assert producer_order(history, "p") == [], f"out of send order (seed={seed})"

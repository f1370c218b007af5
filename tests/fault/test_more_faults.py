"""More node faults under an acks=all idempotent workload, judged by the history checker.

* every node SIGKILLed at the same moment, restarted together and then one by one;
* a follower SIGSTOPped past its ZooKeeper session, then SIGCONTed: it rejoins the ISR;
* a leader SIGSTOPped for half its session, several times: no failover needed, no record fails;
* two failovers back to back: the new leader SIGKILLed as soon as it is elected.

Each ends with the checker: nothing acknowledged lost, nothing duplicated, every reader in
offset order, every partition in the producer's send order, replicas identical. Seeded:
FABRIC_FAULT_SEED=<seed> reproduces the fault schedule.
"""

from __future__ import annotations

import itertools
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Producer
from tests.conftest import make_cluster
from tests.fault.harness import (
    NODE_ARGS,
    Writer,
    create_replicated_topic,
    describe,
    finish,
    keep_logs,
    leader_of,
    producer_diagnostics,
    start_workload,
    wait_for_full_isr,
    wait_until,
)
from tests.fault.history import History, producer_order

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 2_000
RATE_PER_S = 1_200


@pytest.fixture
def fault_cluster(zk_server: LocalZooKeeper, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Three nodes of their own; ``indirect`` parametrization gives the session timeout (ms).
    Stopped (SIGCONT, SIGTERM, then SIGKILL) whatever the test left paused or running."""
    session_ms = getattr(request, "param", SESSION_TIMEOUT_MS)
    cluster = make_cluster(zk_server, tmp_path / "cluster", session_timeout_ms=session_ms, node_args=NODE_ARGS)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        keep_logs(cluster, request.node.name)


def acked_after(writer: Writer, partition: int, since: float) -> bool:
    """Whether a write sent after ``since`` (monotonic) was acknowledged on ``partition``."""
    return any(sent > since for sent, _acked in list(writer.sent_and_acked.get(partition, [])))


def wait_for_acks_after(writer: Writer, partitions: int, since: float, what: str, timeout_s: float = 60.0) -> float:
    """Wait until every partition acknowledged a write sent after ``since``; seconds it took."""
    try:
        wait_until(lambda: all(acked_after(writer, p, since) for p in range(partitions)), what, timeout_s)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}: {producer_diagnostics(writer)}") from None
    return time.monotonic() - since


def node_address(bootstrap: str, node_id: int) -> str:
    with Admin(bootstrap) as admin:
        return admin.nodes()[node_id]


def longest_ack_gap(writer: Writer, start_s: float, end_s: float) -> float:
    """The longest time within [start_s, end_s] that any partition went without an ack."""
    longest = 0.0
    for times in list(writer.ack_times.values()):
        inside = [t for t in list(times) if start_s < t < end_s]
        edges = [start_s, *inside, end_s]
        longest = max(longest, *(b - a for a, b in itertools.pairwise(edges)))
    return longest


def kill_all_at_once(cluster: LocalCluster) -> None:
    """SIGKILL to every node before waiting for any of them (``kill()`` waits for each)."""
    for node in cluster.nodes.values():
        node.process.signal(signal.SIGKILL)
    for node in cluster.nodes.values():
        node.kill()  # reaps it and closes its log


def check_order(history: History, seed: int) -> None:
    problems = producer_order(history, "w")
    assert not problems, f"partitions out of the producer's send order (seed={seed}): {problems[:5]}"


def write_one_per_partition(bootstrap: str, topic: str, partitions: int, history: History, label: str) -> None:
    """A new producer's acks=all write to each partition, acknowledged (recorded in the history)."""
    with Producer(bootstrap, acks="all", enable_idempotence=True, delivery_timeout_ms=60_000,
                  request_timeout_ms=10_000) as producer:
        for p in range(partitions):
            value = f"{label}-{p}".encode()
            history.record_sent(value)
            meta = producer.send(topic, value, partition=p).result(timeout=60)
            history.record_ack(value, meta.partition, meta.offset)


def test_kill_all_nodes_at_once(fault_cluster: LocalCluster, seed: int) -> None:
    """SIGKILL all three nodes at the same moment under acks=all idempotent writes; restart
    all three together; then again, restarting them in a seeded order with seeded delays
    (some past the session timeout). Writes resume; nothing acknowledged is lost."""
    rng = random.Random(seed)
    bootstrap, topic, partitions = fault_cluster.bootstrap, "kill-all", 3
    create_replicated_topic(bootstrap, topic, partitions)
    history, writer, reader = start_workload(bootstrap, topic, partitions, rate_per_s=RATE_PER_S)
    try:
        for style in ("together", "one by one"):
            time.sleep(rng.uniform(1.0, 2.5))
            acked_before = len(history.acked)
            kill_all_at_once(fault_cluster)
            killed_at = time.monotonic()
            down_s = rng.uniform(0.0, 1.5)
            time.sleep(down_s)
            order = sorted(fault_cluster.nodes)
            rng.shuffle(order)
            delays = [0.0] * 3 if style == "together" else [rng.uniform(0.0, 3.5) for _ in order]
            for node_id, delay in zip(order, delays, strict=True):
                time.sleep(delay)
                fault_cluster.nodes[node_id].start()
            fault_cluster.wait_for_nodes(order)
            restarted_at = time.monotonic()
            wait_for_full_isr(bootstrap, topic)
            took = wait_for_acks_after(writer, partitions, restarted_at, f"writes after the restart ({style})")
            print(f"{style}: killed all with {acked_before} acked, down {down_s:.1f} s, restarted {order} with delays "
                  f"{[round(d, 1) for d in delays]}; writes back {took:.1f} s after the last restart "
                  f"({time.monotonic() - killed_at:.1f} s after the kill)", flush=True)
        # The cluster serves a new producer too (its writes join the history).
        write_one_per_partition(bootstrap, topic, partitions, history, "after")
        time.sleep(1.0)
    finally:
        writer.stop_flag.set()
    finish(fault_cluster, topic, partitions, history, seed, [writer], [reader])
    check_order(history, seed)
    assert not history.failed, f"writes failed (seed={seed}): {list(history.failed.items())[:5]}"


def test_follower_paused_past_its_session_rejoins(fault_cluster: LocalCluster, seed: int) -> None:
    """SIGSTOP a follower that leads nothing, longer than its session: once the ISR has
    shrunk, writes go on without it; after SIGCONT it registers again, catches up and is
    back in every ISR. Nothing lost or duplicated."""
    pause_a_follower(fault_cluster, seed, stall_bound_s=None)


# The stall: the producer's leader recheck (sdk/producer.py _check_timeouts) refreshes its
# map on the sender thread with the stalled leaders in ``avoid``, so the stopped follower is
# asked first, and the refresh waits METADATA_TIMEOUT_MS (5 s) for its answer while no batch
# is sent or answered (sdk/_client.py MetadataClient.refresh). Seen on every seed tried.
STALL_BOUND_S = 1.5 + 2.0  # --replica-lag-max-ms, then a leader recheck and a refresh


def test_paused_follower_does_not_stall_the_producer(fault_cluster: LocalCluster, seed: int) -> None:
    """As above, with a bound: while the follower is stopped, no partition goes longer than
    replica_lag_max_ms plus 2 s without an acknowledged write. (The producer's leader
    recheck asked the stopped follower for metadata first and waited METADATA_TIMEOUT_MS on
    its sender thread: every partition stalled about 6 s; sdk/_client.py
    METADATA_QUICK_ANSWER_MS.)"""
    pause_a_follower(fault_cluster, seed, stall_bound_s=STALL_BOUND_S)


def lead_from_2_and_3(bootstrap: str, topic: str) -> None:
    """Partitions 0 and 1 led by nodes 2 and 3: node 1, which leads nothing, is then the node
    a new producer asks first (the bootstrap lists nodes by id), so it holds a connection to it."""
    with Admin(bootstrap) as admin:
        for partition, replicas in ((0, [2, 3, 1]), (1, [3, 2, 1])):
            admin.reassign_partition(topic, partition, replicas)
            admin.wait_reassigned(topic, partition, replicas)
        admin.elect_preferred_leaders([topic])
    wait_until(lambda: [leader_of(bootstrap, topic, p) for p in (0, 1)] == [2, 3], "nodes 2 and 3 to lead")


def pause_a_follower(fault_cluster: LocalCluster, seed: int, stall_bound_s: float | None) -> None:
    rng = random.Random(seed)
    # Two partitions on three nodes, preferred leaders on two of them: one node leads none.
    bootstrap, topic, partitions = fault_cluster.bootstrap, "pause-follower", 2
    create_replicated_topic(bootstrap, topic, partitions)
    if stall_bound_s is not None:
        lead_from_2_and_3(bootstrap, topic)
    history, writer, reader = start_workload(bootstrap, topic, partitions, rate_per_s=RATE_PER_S)
    try:
        time.sleep(rng.uniform(1.0, 2.0))
        leaders = {leader_of(bootstrap, topic, p) for p in range(partitions)}
        idle = sorted(n for n in fault_cluster.nodes if n not in leaders)
        victim = rng.choice(idle)
        live = next(n for n in fault_cluster.nodes if n != victim)
        live_address = node_address(bootstrap, live)  # describes go to a node that answers
        fault_cluster.nodes[victim].pause()
        paused_at = time.monotonic()
        wait_until(lambda: all(victim not in p.isr for p in describe(live_address, topic).partitions),
                   "the ISR to shrink without the stopped follower", timeout_s=30)
        shrunk_at = time.monotonic()
        took = wait_for_acks_after(writer, partitions, shrunk_at, "writes while the follower is stopped",
                                   timeout_s=20)
        pause_s = rng.uniform(2.0, 3.0) * SESSION_TIMEOUT_MS / 1000
        time.sleep(max(0.0, paused_at + pause_s - time.monotonic()))
        assert all(victim not in p.isr for p in describe(live_address, topic).partitions)
        fault_cluster.nodes[victim].resume()
        resumed_at = time.monotonic()
        stall_s = longest_ack_gap(writer, paused_at, resumed_at)
        print(f"follower {victim} (leaders {sorted(leaders)}) stopped {resumed_at - paused_at:.1f} s; ISR shrank "
              f"after {shrunk_at - paused_at:.1f} s, writes acknowledged {took:.1f} s later; longest time without "
              f"an ack while it was stopped {stall_s:.1f} s", flush=True)
        fault_cluster.wait_for_nodes([victim])  # registered again, with a new session
        wait_for_full_isr(bootstrap, topic, timeout_s=45)
        rejoined_s = time.monotonic() - resumed_at
        with Admin(bootstrap) as admin:
            isr = {p.partition: p.isr for p in admin.describe_topic(topic).partitions}
        assert all(victim in members for members in isr.values()), isr
        print(f"follower {victim} back in every ISR {rejoined_s:.1f} s after SIGCONT: {isr}", flush=True)
        wait_for_acks_after(writer, partitions, time.monotonic(), "writes with the follower back")
    finally:
        writer.stop_flag.set()
    finish(fault_cluster, topic, partitions, history, seed, [writer], [reader])
    check_order(history, seed)
    assert not history.failed, f"writes failed (seed={seed}): {list(history.failed.items())[:5]}"
    if stall_bound_s is not None:
        assert stall_s <= stall_bound_s, (
            f"no write acknowledged for {stall_s:.1f} s while follower {victim}, which leads nothing, was stopped "
            f"(bound {stall_bound_s} s; seed={seed})")


SHORT_PAUSE_SESSION_MS = 4_000


@pytest.mark.parametrize("fault_cluster", [SHORT_PAUSE_SESSION_MS], ids=["session4s"], indirect=True)
def test_leader_paused_shorter_than_its_session(fault_cluster: LocalCluster, seed: int) -> None:
    """SIGSTOP one partition's leader for half its session, four times in a row: no record
    fails (delivery_timeout_ms is never reached), nothing lost or duplicated."""
    rng = random.Random(seed)
    bootstrap, topic, partitions = fault_cluster.bootstrap, "pause-leader-short", 3
    create_replicated_topic(bootstrap, topic, partitions)
    history, writer, reader = start_workload(bootstrap, topic, partitions, rate_per_s=RATE_PER_S)
    try:
        partition = rng.randrange(partitions)
        for round_ in range(4):
            time.sleep(rng.uniform(0.5, 1.5))
            victim = leader_of(bootstrap, topic, partition)
            epoch = describe(bootstrap, topic).partitions[partition].leader_epoch
            pause_s = SHORT_PAUSE_SESSION_MS / 1000 / 2
            fault_cluster.nodes[victim].pause()
            paused_at = time.monotonic()
            time.sleep(pause_s)
            fault_cluster.nodes[victim].resume()
            resumed_at = time.monotonic()
            took = wait_for_acks_after(writer, partitions, resumed_at, "writes after SIGCONT")
            after = describe(bootstrap, topic).partitions[partition]
            print(f"round {round_}: leader {victim} of partition {partition} stopped {resumed_at - paused_at:.1f} s; "
                  f"every partition acknowledged again {took:.2f} s after SIGCONT; leader now {after.leader} "
                  f"epoch {epoch} -> {after.leader_epoch}, isr {after.isr}", flush=True)
            wait_for_full_isr(bootstrap, topic)
        latency = max((a - s for acks in list(writer.sent_and_acked.values()) for s, a in acks), default=0.0)
        print(f"longest send-to-ack: {latency:.2f} s")
    finally:
        writer.stop_flag.set()
    finish(fault_cluster, topic, partitions, history, seed, [writer], [reader])
    check_order(history, seed)
    assert not history.failed, f"writes failed (seed={seed}): {list(history.failed.items())[:5]}"


def test_two_failovers_back_to_back(fault_cluster: LocalCluster, seed: int) -> None:
    """SIGKILL a partition's leader and, as soon as a new leader is elected, SIGKILL that
    one too (the first victim restarted in between or not, seeded); three rounds."""
    rng = random.Random(seed)
    bootstrap, topic, partitions = fault_cluster.bootstrap, "double-failover", 3
    create_replicated_topic(bootstrap, topic, partitions)
    history, writer, reader = start_workload(bootstrap, topic, partitions, rate_per_s=RATE_PER_S)
    try:
        for round_ in range(3):
            time.sleep(rng.uniform(0.5, 1.5))
            partition = rng.randrange(partitions)
            first = leader_of(bootstrap, topic, partition)
            fault_cluster.nodes[first].kill()
            killed_at = time.monotonic()
            wait_until(lambda p=partition, v=first: leader_of(bootstrap, topic, p) not in (v, -1), "a new leader")
            second = leader_of(bootstrap, topic, partition)
            restart_first = rng.random() < 0.5
            if restart_first:
                fault_cluster.nodes[first].start()
            fault_cluster.nodes[second].kill()
            elected_s = time.monotonic() - killed_at
            third = next(n for n in fault_cluster.nodes if n not in (first, second))
            if restart_first:
                fault_cluster.wait_for_nodes([first])
            else:
                # Only the third node is left: it takes over if it was in the ISR, but with
                # min_insync 2 it cannot acknowledge acks=all writes alone.
                try:
                    wait_until(lambda p=partition, t=third: leader_of(bootstrap, topic, p) == t, "the last node to lead",
                               timeout_s=10)
                    print(f"round {round_}: node {third} leads partition {partition} alone")
                except TimeoutError:
                    print(f"round {round_}: node {third} did not take partition {partition} (not in its ISR?)")
                time.sleep(rng.uniform(0.0, 2.0))
                fault_cluster.nodes[first].start()
                fault_cluster.wait_for_nodes([first])
            back_at = time.monotonic()
            wait_for_acks_after(writer, partitions, back_at, "writes with two nodes up")
            fault_cluster.nodes[second].start()
            fault_cluster.wait_for_nodes([second])
            wait_for_full_isr(bootstrap, topic)
            print(f"round {round_}: partition {partition}: killed {first}, then new leader {second} "
                  f"{elected_s:.1f} s later ({'first restarted in between' if restart_first else 'first still down'}); "
                  f"all in sync {time.monotonic() - killed_at:.1f} s after the first kill", flush=True)
    finally:
        writer.stop_flag.set()
    finish(fault_cluster, topic, partitions, history, seed, [writer], [reader])
    check_order(history, seed)
    assert not history.failed, f"writes failed (seed={seed}): {list(history.failed.items())[:5]}"

"""Fault tests: kill, pause, expire and skew real node processes; a checker judges the history.

Every test prints its seed; rerun one with FABRIC_FAULT_SEED=<seed>. They are marked
``slow``: ``scripts/test.sh -m "not slow"`` skips them while developing, CI runs them all.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalCluster, LocalZooKeeper
from fabric.protocol import apis, batch
from fabric.protocol.apis import ApiKey
from sdk import Admin, Producer
from tests.conftest import make_cluster
from tests.fault.harness import (
    NODE_ARGS,
    Writer,
    create_replicated_topic,
    describe,
    expire_session,
    finish,
    keep_logs,
    leader_of,
    start_workload,
    wait_for_full_isr,
    wait_until,
)
from tests.fault.history import History

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 2_000
BURST_SESSION_TIMEOUT_MS = 8_000
BURST_ATTEMPTS_MAX = 3  # pauses tried until the stream overflows (each burst twice the last)
GAP_NOTICE_WAIT_S = 5.0  # after a resume, how long the follower has to log that it saw the gap


@pytest.fixture
def fault_cluster(zk_server: LocalZooKeeper, tmp_path: Path, request: pytest.FixtureRequest,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    secure = getattr(request, "param", False)  # indirect parametrization: a secure cluster (docs/SECURITY.md)
    cluster = make_cluster(zk_server, tmp_path / "cluster", session_timeout_ms=SESSION_TIMEOUT_MS, node_args=NODE_ARGS,
                           secure=secure)
    cluster.start()
    if cluster.security is not None:  # every SDK object of the harness then uses the operator's key
        for name, value in cluster.security.environment().items():
            monkeypatch.setenv(name, value)
    try:
        yield cluster
    finally:
        cluster.stop()
        keep_logs(cluster, request.node.name)


# Secure: half the rounds and records. What it adds is CURVE and authorization through
# failovers (reconnects, new leaders' keys); the plaintext run has the rounds, and the
# suite's time is bounded (CI runs the whole suite in under 30 minutes). The records'
# floor is about what the rounds take at 3,000/s: a higher one only waited after the last
# kill (100,000 added 10-15 s of writing with no fault in it).
@pytest.mark.parametrize(("fault_cluster", "rounds", "records_min"), [(False, 10, 60_000), (True, 5, 30_000)],
                         ids=["plaintext", "secure"], indirect=["fault_cluster"])
def test_kill_leader_again_and_again(fault_cluster: LocalCluster, rounds: int, records_min: int, seed: int) -> None:
    """Ten SIGKILLs (five, secure) of a busy partition's leader under acks=all idempotent writes."""
    rng = random.Random(seed)
    bootstrap, topic, partitions = fault_cluster.bootstrap, "kill-leader", 6
    create_replicated_topic(bootstrap, topic, partitions)
    history, writer, reader = start_workload(bootstrap, topic, partitions, rate_per_s=3_000)
    failover_s: list[float] = []
    for _round in range(rounds):
        partition = rng.randrange(partitions)
        victim = leader_of(bootstrap, topic, partition)
        killed_at = time.monotonic()
        fault_cluster.nodes[victim].kill()
        wait_until(lambda p=partition, v=victim: leader_of(bootstrap, topic, p) not in (v, -1), "a new leader")
        try:
            wait_until(lambda p=partition, t=killed_at: any(s > t for s, _a in writer.sent_and_acked.get(p, [])),
                       "an acknowledged write sent after the kill")
        except TimeoutError:
            producer = writer.producer
            queued = producer._acc.batches.get((topic, partition), [])  # diagnostics only
            flights = [(f.address, round(time.monotonic() - f.sent_s, 1)) for f in producer._in_flight.values()
                       if any(b.partition == partition for b in f.batches)]
            print(f"no ack on partition {partition} after killing node {victim} (seed={seed}); failures so far: "
                  f"{len(history.failed)} {list(history.failed.items())[:5]}; writer sent {writer.sent}; "
                  f"queued batches {len(queued)} (attempts {[b.attempts for b in queued][:5]}), in flight {flights}, "
                  f"leaders {producer_leaders(writer)}")
            raise
        failover_s.append(min(a for s, a in writer.sent_and_acked[partition] if s > killed_at) - killed_at)
        print(f"round {_round}: killed node {victim}, leader of partition {partition}; "
              f"next ack after {failover_s[-1]:.2f} s", flush=True)
        fault_cluster.nodes[victim].start()
        fault_cluster.wait_for_nodes([victim])
        wait_for_full_isr(bootstrap, topic)
        time.sleep(rng.uniform(0.1, 0.8))
    wait_until(lambda: writer.sent >= records_min, f"{records_min:,} messages sent", timeout_s=120)
    print(f"failover (kill -> next acks=all write on that partition): median {statistics.median(failover_s):.2f} s, "
          f"max {max(failover_s):.2f} s over {len(failover_s)} failovers; session timeout {SESSION_TIMEOUT_MS} ms")
    finish(fault_cluster, topic, partitions, history, seed, [writer], [reader])
    assert not history.failed, f"writes failed: {list(history.failed.items())[:5]}"
    assert len(history.acked) >= records_min


def producer_leaders(writer: Writer) -> dict[int, int]:
    return {p.partition: p.leader for p in describe(writer.producer._bootstrap.node_addresses()[0], "kill-leader").partitions}


def raw_produce(sock: zmq.Socket, topic: str, partition: int, value: bytes, acks: int, correlation_id: int) -> None:
    data = batch.encode_batch([int(time.time() * 1000)], [None], [value])
    sock.send_multipart(apis.encode_request(ApiKey.PRODUCE, {
        "acks": acks, "timeout_ms": 3_000, "entries": [{"topic": topic, "partition": partition}]}, correlation_id,
        batches=[data]))


def test_paused_leader_cannot_acknowledge_after_waking(fault_cluster: LocalCluster, seed: int) -> None:
    """SIGSTOP the leader past its session, let a new leader take over, SIGCONT it while
    clients keep writing to it directly (acks=1 and acks=all): nothing it acknowledges is lost."""
    rng = random.Random(seed)
    bootstrap, topic, partitions = fault_cluster.bootstrap, "pause-leader", 3
    create_replicated_topic(bootstrap, topic, partitions)
    history = History()
    writer = Writer(bootstrap, topic, history, count=10**9, rate_per_s=1_000)
    writer.start()
    partition = rng.randrange(partitions)
    victim = leader_of(bootstrap, topic, partition)
    with Admin(bootstrap) as admin:
        victim_address = admin.nodes()[victim]
    ctx = zmq.Context.instance()
    stale = ctx.socket(zmq.DEALER)
    stale.setsockopt(zmq.LINGER, 0)
    stale.connect(victim_address)
    pending: dict[int, bytes] = {}

    def stale_write(i: int) -> None:
        value = b"stale-%d" % i
        history.record_sent(value)
        pending[i + 1] = value
        raw_produce(stale, topic, partition, value, acks=-1 if i % 2 else 1, correlation_id=i + 1)

    time.sleep(1.0)
    fault_cluster.nodes[victim].pause()
    paused_at = time.monotonic()
    wait_until(lambda: leader_of(bootstrap, topic, partition) not in (victim, -1), "a new leader while paused")
    for i in range(20):
        stale_write(i)  # queued in the paused node's socket: processed the moment it wakes
    time.sleep(max(0.0, SESSION_TIMEOUT_MS / 1000 * 1.5 - (time.monotonic() - paused_at)))
    fault_cluster.nodes[victim].resume()
    for i in range(20, 80):
        stale_write(i)
        time.sleep(0.05)
    acknowledged = 0
    deadline = time.monotonic() + 10
    while pending and time.monotonic() < deadline:
        if not stale.poll(200):
            continue
        reply = apis.decode_response(stale.recv_multipart())
        value = pending.pop(reply.header.correlation_id, None)
        if value is None or reply.header.error_code:
            continue
        result = reply.body["results"][0]
        if result["error"] == 0:
            history.record_ack(value, partition, result["base_offset"])
            acknowledged += 1
    stale.close(linger=0)
    print(f"the woken ex-leader acknowledged {acknowledged} of 80 direct writes")
    finish(fault_cluster, topic, partitions, history, seed, [writer], [])


def test_session_expiry_and_zookeeper_outage(zk_server: LocalZooKeeper, tmp_path: Path, seed: int) -> None:
    """Expire the leader's ZooKeeper session from outside, then stop ZooKeeper itself for a
    moment (every node loses its connection): the same guarantees."""
    rng = random.Random(seed)
    # Its own ZooKeeper, because this test pauses the server.
    cluster = LocalCluster(3, tmp_path / "cluster", session_timeout_ms=3_000, node_args=NODE_ARGS)
    with cluster:
        bootstrap, topic, partitions = cluster.bootstrap, "expire", 3
        create_replicated_topic(bootstrap, topic, partitions)
        history, writer, reader = start_workload(bootstrap, topic, partitions, rate_per_s=1_500)
        for _round in range(2):
            partition = rng.randrange(partitions)
            victim = leader_of(bootstrap, topic, partition)
            started_ms = _registration(cluster, victim).started_ms
            expire_session(cluster.zk_address, cluster.nodes[victim].data_dir)
            wait_until(lambda p=partition, v=victim: leader_of(bootstrap, topic, p) not in (v, -1),
                       "a new leader after the session expired")
            cluster.wait_for_nodes([victim])  # it registers again with a new session
            wait_for_full_isr(bootstrap, topic)
            # ... as the same process: `fabric status` uptime does not start again
            assert _registration(cluster, victim).started_ms == started_ms
        assert cluster.zookeeper is not None
        cluster.zookeeper.process.pause()
        time.sleep(rng.uniform(1.0, 2.0))
        cluster.zookeeper.process.resume()
        wait_for_full_isr(bootstrap, topic)
        time.sleep(1.0)
        finish(cluster, topic, partitions, history, seed, [writer], [reader])


def _registration(cluster: LocalCluster, node_id: int) -> zkl.NodeInfo:
    zk = zkl.make_client(cluster.zk_address)
    try:
        zk.start(timeout=10)
        return zkl.live_nodes(zk)[node_id]
    finally:
        zkl.close_client(zk)


def test_burst_past_pub_hwm_and_kill_a_follower(zk_server: LocalZooKeeper, tmp_path: Path, seed: int) -> None:
    """Overflow the PUB/SUB stream (a paused follower's queue fills, PUB drops) and kill a
    follower mid-stream: followers end byte-identical to the leader."""
    rng = random.Random(seed)
    # A small high-water mark and kernel buffer, so a few seconds of stopped follower
    # overflow the stream (loopback's auto-tuned buffers would otherwise hold megabytes).
    # A session long enough that the stopped follower stays registered through its pause: the
    # test is about noticing the stream's gap, which a session expiry would paper over (a
    # node that registers again truncates and fetches anyway).
    fault_cluster = make_cluster(zk_server, tmp_path / "cluster", session_timeout_ms=BURST_SESSION_TIMEOUT_MS,
                                 node_args=[*NODE_ARGS, "--replication-hwm", "50", "--replication-buffer-bytes", "65536"])
    fault_cluster.start()
    try:
        burst(fault_cluster, rng, seed)
    finally:
        fault_cluster.stop()
        keep_logs(fault_cluster, "test_burst_past_pub_hwm_and_kill_a_follower")


def burst(fault_cluster: LocalCluster, rng: random.Random, seed: int) -> None:
    bootstrap, topic, partitions = fault_cluster.bootstrap, "burst", 2
    create_replicated_topic(bootstrap, topic, partitions)
    leaders = {leader_of(bootstrap, topic, p) for p in range(partitions)}
    # The follower to stop and kill leads nothing: its pause then stops no partition (which
    # would wait a session timeout for a failover) and only the stream to it overflows.
    idle = [n for n in fault_cluster.nodes if n not in leaders]
    followers = idle or [n for n in fault_cluster.nodes if n != leader_of(bootstrap, topic, 0)]
    rng.shuffle(followers)
    victim = followers[0]
    history = History()
    # Phases, each flushed, so the data really crosses the wire while a follower is down.
    # While one is stopped the leader publishes thousands of 1 KB batches into a 50-message
    # high-water mark and 64 KB of socket buffer: PUB drops, and the follower must notice.
    producer = Producer(bootstrap, acks=1, linger_ms=0, batch_bytes_max=1_024, enable_idempotence=False)
    sent = 0

    def phase(records: int) -> None:
        nonlocal sent
        for i in range(sent, sent + records):
            value = b"burst-%d-" % i + b"." * 90
            history.record_sent(value)
            future = producer.send(topic, value, partition=i % partitions)
            future.add_callback(lambda meta, exc, v=value: history.record_ack(v, meta.partition, meta.offset)
                                if exc is None else history.record_failure(v, exc))
        sent += records
        producer.flush(timeout=120)

    def gap_noticed() -> bool:
        return "streaming -> fetching" in "".join(p.read_text() for p in fault_cluster.base_dir.glob("node*.log"))

    try:
        phase(rng.randrange(2_000, 5_000))
        burst_records, paused_s = 20_000, 0.0
        # A burst that the stream's buffers happened to hold (the leader's requests and
        # the loopback buffers vary from run to run: CI once sent 20,000 records in 0.58 s
        # without a drop) proves nothing: pause again with a bigger one, a few times at most.
        for _attempt in range(BURST_ATTEMPTS_MAX):
            fault_cluster.nodes[victim].pause()
            paused_at = time.monotonic()
            phase(burst_records)  # all published while the follower is stopped
            paused_s = max(paused_s, time.monotonic() - paused_at)
            fault_cluster.nodes[victim].resume()
            phase(5_000)
            noticed_by = time.monotonic() + GAP_NOTICE_WAIT_S
            while not gap_noticed() and time.monotonic() < noticed_by:
                time.sleep(0.2)
            if gap_noticed() or paused_s * 1000 > BURST_SESSION_TIMEOUT_MS:
                break
            burst_records *= 2
        fault_cluster.nodes[victim].kill()  # and killed mid-stream
        phase(10_000)
        fault_cluster.nodes[victim].start()
        phase(5_000)
    finally:
        producer.close()
    total = sent
    finish(fault_cluster, topic, partitions, history, seed, [], [])
    assert len(history.acked) == total
    # The point of the test: the stream really dropped, and the follower noticed the gap and
    # healed by fetching. Only if the pause outlasted its session (a very slow machine) did it
    # register again and truncate instead, which heals the same way but proves less: say so.
    logs = "".join(p.read_text() for p in fault_cluster.base_dir.glob("node*.log"))
    print(f"follower {victim} stopped for up to {paused_s:.1f} s while up to {burst_records:,} records were sent")
    if "streaming -> fetching" not in logs:
        assert paused_s * 1000 > BURST_SESSION_TIMEOUT_MS, "the burst never overflowed the stream; make it bigger"
        print("its session expired during the pause: it healed by registering again, not by noticing the gap")


def test_two_of_three_down_refuses_then_resumes(fault_cluster: LocalCluster, seed: int) -> None:
    """With two of three replicas dead, acks=all is refused (NOT_ENOUGH_REPLICAS) and nothing
    is acknowledged; with one back, writes resume; nothing acknowledged is lost."""
    rng = random.Random(seed)
    bootstrap, topic = fault_cluster.bootstrap, "two-down"
    create_replicated_topic(bootstrap, topic, 1)
    history = History()
    writer = Writer(bootstrap, topic, history, count=10**9, rate_per_s=500)
    writer.start()
    time.sleep(1.0)
    victims = rng.sample(sorted(fault_cluster.nodes), 2)
    survivor = next(n for n in fault_cluster.nodes if n not in victims)
    for victim in victims:
        fault_cluster.nodes[victim].kill()
    wait_until(lambda: tuple(describe(bootstrap, topic).partitions[0].isr) == (survivor,)
               and describe(bootstrap, topic).partitions[0].leader == survivor, "the survivor alone in the ISR")
    refused_from = time.monotonic()
    with Admin(bootstrap) as admin:
        address = admin.nodes()[survivor]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        # The survivor may first answer with another retriable error (still applying the
        # new state, or re-checking its session after a stall); what it must never do is
        # accept the write. Retry until it gives the definite refusal.
        deadline = time.monotonic() + 20
        for attempt in range(1, 1_000):
            value = b"must-be-refused-%d" % attempt
            history.record_sent(value)
            raw_produce(sock, topic, 0, value, acks=-1, correlation_id=attempt)
            assert sock.poll(10_000), "the survivor did not answer"
            result = apis.decode_response(sock.recv_multipart()).body["results"][0]
            assert result["error"] != 0, f"acks=all write accepted with one replica alive (seed={seed})"
            if result["error"] == errors.NotEnoughReplicasError.code or time.monotonic() > deadline:
                break
            assert errors.error_for_code(result["error"]).retriable, result
            time.sleep(0.2)
    finally:
        sock.close(linger=0)
    assert result["error"] == errors.NotEnoughReplicasError.code, result
    time.sleep(2.0)
    refused_until = time.monotonic()
    acked_during_outage = [t for t in writer.ack_times.get(0, []) if refused_from < t < refused_until]
    assert not acked_during_outage, f"{len(acked_during_outage)} writes acknowledged with one replica (seed={seed})"
    back = victims[0]
    fault_cluster.nodes[back].start()
    fault_cluster.wait_for_nodes([back])
    resumed_from = time.monotonic()
    wait_until(lambda: any(t > resumed_from for t in writer.ack_times.get(0, [])), "writes to resume", timeout_s=60)
    finish(fault_cluster, topic, 1, history, seed, [writer], [])


LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


@pytest.mark.skipif(not Path(LIBFAKETIME).exists(), reason="faketime is not installed (scripts/install.sh installs it)")
def test_skewed_wall_clocks_change_nothing(zk_server: LocalZooKeeper, tmp_path: Path, seed: int) -> None:
    """Each node under a different wall clock (libfaketime): leases and timeouts are
    monotonic, so failover and replication behave the same."""
    rng = random.Random(seed)
    cluster = make_cluster(zk_server, tmp_path / "cluster", nodes=0, session_timeout_ms=SESSION_TIMEOUT_MS,
                           node_args=NODE_ARGS)
    with cluster:
        skews = ["+2d", "-3h", "+17m"]
        for node_id, skew in zip((1, 2, 3), skews, strict=True):
            cluster.add_node(node_id, env={"LD_PRELOAD": LIBFAKETIME, "FAKETIME": skew})
        bootstrap, topic, partitions = cluster.bootstrap, "skewed", 3
        create_replicated_topic(bootstrap, topic, partitions)
        history, writer, reader = start_workload(bootstrap, topic, partitions, rate_per_s=1_500)
        for _round in range(3):
            partition = rng.randrange(partitions)
            victim = leader_of(bootstrap, topic, partition)
            cluster.nodes[victim].kill()
            wait_until(lambda p=partition, v=victim: leader_of(bootstrap, topic, p) not in (v, -1), "a new leader")
            cluster.nodes[victim].start()
            cluster.wait_for_nodes([victim])
            wait_for_full_isr(bootstrap, topic)
        finish(cluster, topic, partitions, history, seed, [writer], [reader])

"""Network partition: a leader cut off from ZooKeeper and from its followers.

Every node runs in its own network namespace (``tests/fault/netns.py``); iptables inside
the victim's namespace drops everything to and from ZooKeeper and the other nodes, while
the test's clients still reach it. The isolated leader must acknowledge nothing once its
session can have ended (the majority elects a new leader then), the majority goes on,
and after healing the checker finds 0 lost and 0 divergent.
"""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

import pytest
import zmq

from fabric.local import LocalCluster, LocalZooKeeper
from fabric.protocol import apis, batch
from fabric.protocol.apis import ApiKey
from sdk import Admin
from tests.fault import netns
from tests.fault.harness import (
    NODE_ARGS,
    create_replicated_topic,
    finish,
    keep_logs,
    leader_of,
    start_workload,
    wait_until,
)

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 3_000


@pytest.fixture(scope="module")
def network_available() -> None:
    reason = netns.unavailable_reason()
    if reason is not None:
        pytest.skip(f"network partition test needs namespaces: {reason}")


@pytest.mark.parametrize("cut", ["zookeeper-and-followers", "zookeeper-only"])
def test_isolated_leader_acknowledges_nothing_after_its_session(tmp_path: Path, seed: int, cut: str,
                                                               network_available: None) -> None:
    """``zookeeper-and-followers``: the leader is alone (a minority of one). ``zookeeper-only``:
    it still reaches its followers, so acks=all writes may go on until they follow the new
    leader; the acknowledged ones must all survive."""
    rng = random.Random(seed)
    node_ids = [1, 2, 3]
    with netns.Network(node_ids) as net:
        zookeeper = LocalZooKeeper(tmp_path / "zk", host=net.zk_ip)
        (tmp_path / "zk").mkdir()
        cluster = LocalCluster(0, tmp_path / "cluster", zk_address=zookeeper.address,
                               session_timeout_ms=SESSION_TIMEOUT_MS, node_args=NODE_ARGS)
        try:
            zookeeper.start()
            for node_id in node_ids:
                cluster.add_node(node_id, wait=False, netns=net.namespace(node_id),
                                 extra_args=["--host", net.ip(node_id)])
            cluster.wait_for_nodes(node_ids)
            partitioned(cluster, net, rng, seed, from_nodes=cut == "zookeeper-and-followers")
        finally:
            cluster.stop()
            zookeeper.stop()
            keep_logs(cluster, f"test_isolated_leader_acknowledges_nothing_after_its_session-{cut}")


def partitioned(cluster: LocalCluster, net: netns.Network, rng: random.Random, seed: int, *, from_nodes: bool) -> None:
    bootstrap, topic, partitions = cluster.bootstrap, "partitioned", 3
    create_replicated_topic(bootstrap, topic, partitions)
    history, writer, reader = start_workload(bootstrap, topic, partitions, rate_per_s=1_000)
    time.sleep(2.0)
    partition = rng.randrange(partitions)
    victim = leader_of(bootstrap, topic, partition)
    with Admin(bootstrap) as admin:
        victim_address = admin.nodes()[victim]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(victim_address)
    pending: dict[int, bytes] = {}
    acked_at: list[tuple[float, bytes, bool]] = []  # (when, value, acks=all)

    def direct_write(i: int) -> None:
        # Straight to the victim, alternating acks=1 and acks=all, as a client with a stale
        # routing map would.
        value = b"direct-%d" % i
        history.record_sent(value)
        pending[i + 1] = value
        data = batch.encode_batch([int(time.time() * 1000)], [None], [value])
        sock.send_multipart(apis.encode_request(ApiKey.PRODUCE, {
            "acks": -1 if i % 2 else 1, "timeout_ms": 2_000, "entries": [{"topic": topic, "partition": partition}]},
            i + 1, batches=[data]))

    def collect(until: float) -> None:
        while time.monotonic() < until:
            if not sock.poll(20):
                continue
            reply = apis.decode_response(sock.recv_multipart())
            value = pending.pop(reply.header.correlation_id, None)
            if value is None or reply.header.error_code:
                continue
            result = reply.body["results"][0]
            if result["error"] == 0:
                acks_all = reply.header.correlation_id % 2 == 0
                acked_at.append((time.monotonic(), value, acks_all))
                if acks_all:
                    # acks=all: durable by contract, so the checker must find it. (acks=1 is
                    # leader-only by contract: a leader cut off from its followers loses it when
                    # it is replaced; what matters is that it stops taking them in time.)
                    history.record_ack(value, partition, result["base_offset"])

    isolated_s = SESSION_TIMEOUT_MS / 1000 * 2 + rng.uniform(2.0, 4.0)
    isolated_at = time.monotonic()
    net.isolate(victim, from_nodes=from_nodes)
    i = 0
    while time.monotonic() < isolated_at + isolated_s:
        direct_write(i)
        i += 1
        collect(time.monotonic() + 0.05)
    wait_until(lambda: leader_of(bootstrap, topic, partition) not in (victim, -1), "a new leader on the majority side")
    times = sorted(t for t in writer.ack_times.get(partition, []) if isolated_at <= t)
    gap = max((b - a for a, b in itertools.pairwise([isolated_at, *times])), default=float("nan"))
    net.heal(victim)
    healed_at = time.monotonic()
    collect(healed_at + 3.0)
    sock.close(linger=0)
    session_end = isolated_at + SESSION_TIMEOUT_MS / 1000
    # Alone, it can acknowledge nothing once its session can have ended. Still reaching its
    # followers, it may go on acknowledging acks=all writes they all have (the checker
    # proves those survive), but never an acks=1 write.
    late = [(round(t - isolated_at, 2), v) for t, v, acks_all in acked_at
            if session_end < t <= healed_at and (from_nodes or not acks_all)]
    print(f"isolated node {victim} (leader of partition {partition}) from ZooKeeper"
          f"{' and its followers' if from_nodes else ' only'} for {isolated_s:.1f} s: it acknowledged "
          f"{len(acked_at)} of {i} direct writes, {len(late)} forbidden ones after its session could have ended; "
          f"the SDK writer's longest gap without acks on that partition: {gap:.2f} s "
          f"(session timeout {SESSION_TIMEOUT_MS / 1000:g} s)", flush=True)
    assert not late, f"the isolated leader acknowledged writes after its session ended: {late[:5]} (seed={seed})"
    finish(cluster, topic, partitions, history, seed, [writer], [reader])

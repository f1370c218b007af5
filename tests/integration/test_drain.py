"""Controlled shutdown on real processes: ``fabric node drain N`` and SIGTERM move a node's
leaderships to in-sync replicas before it exits, under a steady acks=all load that loses
nothing; a drain aimed at an unknown node is a one-line error."""

from __future__ import annotations

import signal
import threading
import time

from fabric.local import LocalCluster
from sdk import Admin, Producer
from tests.integration.helpers import read_all
from tests.integration.test_status import fabric

EXIT_WAIT_S = 30.0
RECORDS_PER_S = 400


def leaders(bootstrap: str, topic: str) -> list[int]:
    with Admin(bootstrap) as admin:
        return [p.leader for p in admin.describe_topic(topic).partitions]


def wait_exit(cluster: LocalCluster, node_id: int) -> int:
    proc = cluster.nodes[node_id].process.proc
    assert proc is not None
    return proc.wait(EXIT_WAIT_S)


def test_drain_moves_leaders_then_stops_and_loses_nothing(fresh_cluster: LocalCluster, topic_name: str) -> None:
    cluster, topic, partitions = fresh_cluster, topic_name, 6
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=3)
    acked: list[bytes] = []
    failed: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        with Producer(cluster.bootstrap, acks="all", linger_ms=2) as producer:
            i = 0
            while not stop.is_set():
                value = b"drain-%d" % i
                future = producer.send(topic, value, partition=i % partitions)
                future.add_callback(lambda _meta, exc, v=value: failed.append(exc) if exc else acked.append(v))
                i += 1
                time.sleep(1 / RECORDS_PER_S)
            producer.flush(60)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        time.sleep(1.0)
        first = leaders(cluster.bootstrap, topic)[0]
        result = fabric("node", "drain", str(first), "-b", cluster.bootstrap)
        assert result.returncode == 0, result.stderr
        assert f"node {first} is draining" in result.stdout
        assert wait_exit(cluster, first) == 0  # a clean exit, not the SIGKILL fallback
        assert first not in leaders(cluster.bootstrap, topic)
        cluster.nodes[first].start()
        cluster.wait_for_nodes([first])
        time.sleep(1.5)  # back in every ISR before the next one goes
        # SIGTERM does the same.
        second = next(n for n in leaders(cluster.bootstrap, topic) if n != first)
        cluster.nodes[second].process.signal(signal.SIGTERM)
        assert wait_exit(cluster, second) == 0
        assert second not in leaders(cluster.bootstrap, topic)
        cluster.nodes[second].start()
        cluster.wait_for_nodes([second])
        time.sleep(1.0)
    finally:
        stop.set()
        writer.join(90)
    assert not failed, failed[:3]
    assert acked, "nothing was acknowledged"
    read = {r.value for r in read_all(cluster.bootstrap, topic, partitions)}
    lost = [v for v in acked if v not in read]
    print(f"drained two nodes under load: {len(acked)} acknowledged, {len(lost)} lost")
    assert not lost, lost[:5]


def test_drain_of_an_unknown_node_is_a_clear_error(cluster: LocalCluster) -> None:
    result = fabric("node", "drain", "99", "-b", cluster.bootstrap)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "node 99 is not registered" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

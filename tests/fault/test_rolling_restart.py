"""A rolling restart of all three nodes under acks=all load: nothing acknowledged is lost,
and the write stall each restart causes is measured and printed (not asserted: tests
never assert wall-clock times; the figure goes to docs/OPERATIONS.md).

Each node in turn gets SIGTERM (a clean stop: it closes its ZooKeeper session, so the
controller moves its leaderships at once instead of after the session timeout), is
started again, rejoins the ISR of every partition, and preferred leaders are restored
before the next node goes, as an operator's rolling restart would do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin
from tests.fault.harness import (
    Reader,
    Writer,
    collect_replicas,
    create_replicated_topic,
    read_everything,
    running_cluster,
    seed_from_env,
    wait_for_full_isr,
)
from tests.fault.history import History, check

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 2_000
NODE_ARGS = ["--replica-lag-max-ms", "1500"]
PARTITIONS = 6
RATE_PER_S = 600
SETTLE_S = 2.0  # steady writes before and after each restart, so the stall is measured inside a busy window


@pytest.fixture
def cluster(zk_server: LocalZooKeeper, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with running_cluster(zk_server, tmp_path / "cluster", request.node.name, SESSION_TIMEOUT_MS) as c:
        yield c


def write_stall_s(writer: Writer, start_s: float, end_s: float) -> float:
    """The longest time, within [start_s, end_s], that any partition went without an ack
    (the gap spanning start_s counts from start_s)."""
    worst = 0.0
    for times in list(writer.ack_times.values()):
        inside = sorted(t for t in list(times) if start_s <= t <= end_s)
        previous = start_s
        for t in inside:
            worst = max(worst, t - previous)
            previous = t
        worst = max(worst, end_s - previous)
    return worst


def test_rolling_restart_under_acks_all_loses_nothing(cluster: LocalCluster) -> None:
    seed = seed_from_env()  # the workload is not random; printed for the record like the others
    bootstrap, topic = cluster.bootstrap, "rolling"
    create_replicated_topic(bootstrap, topic, PARTITIONS)
    history = History()
    writer = Writer(bootstrap, topic, history, count=10**9, rate_per_s=RATE_PER_S)
    reader = Reader(bootstrap, topic, PARTITIONS, history)
    writer.start()
    reader.start()
    stalls: dict[int, float] = {}
    try:
        time.sleep(SETTLE_S)
        for node_id in sorted(cluster.nodes):
            began = time.monotonic()
            cluster.nodes[node_id].stop()  # SIGTERM, then SIGKILL after 10 s if it hangs
            cluster.nodes[node_id].start()
            cluster.wait_for_nodes([node_id])
            wait_for_full_isr(bootstrap, topic)
            with Admin(bootstrap) as admin:
                admin.elect_preferred_leaders([topic])
            time.sleep(SETTLE_S)
            stalls[node_id] = round(write_stall_s(writer, began, time.monotonic() - SETTLE_S / 2), 3)
    finally:
        writer.stop_flag.set()
        writer.join(timeout=240)
    assert writer.error is None, repr(writer.error)
    wait_for_full_isr(bootstrap, topic)
    read_everything(bootstrap, topic, PARTITIONS, history)
    reader.stop_flag.set()
    reader.join(timeout=30)
    assert reader.error is None, repr(reader.error)
    time.sleep(1.0)
    collect_replicas(cluster, topic, PARTITIONS, history)
    report = check(history)
    print(f"seed={seed}: {report.summary()}")
    print("rolling restart write stall per node (s): " + json.dumps(stalls))
    assert report.ok(), report.summary()
    assert not report.lost and report.acked > 0

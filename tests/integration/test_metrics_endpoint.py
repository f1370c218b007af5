"""Every node serves Prometheus metrics, found through its znode; scraped over HTTP while
a producer writes, the series count exactly what the test produced."""

from __future__ import annotations

import os
import threading
import time
import urllib.request

from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from fabric import zk as zkl
from fabric.local import LocalCluster
from sdk import Admin, Producer

RECORDS = 6_000
VALUE_BYTES = 100
PARTITIONS = 3
SCRAPE_TIMEOUT_S = 10
SETTLE_S = 30.0
GROUP_OFFSET = 500  # the committed offset the group-lag check sets
SNAPSHOT_WAIT_S = 3.0  # three of the nodes' metric snapshots (nodes/metrics.py SNAPSHOT_INTERVAL_S)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def endpoints(cluster: LocalCluster) -> dict[int, str]:
    zk = KazooClient(hosts=cluster.zk_address)
    zk.start(timeout=30)
    try:
        return {node_id: info.metrics_address for node_id, info in zkl.live_nodes(zk).items()}
    finally:
        zkl.close_client(zk)


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def led(samples: Samples, name: str, topic: str) -> dict[int, float]:
    """``name`` per partition, for the partitions this node leads."""
    leaders = {dict(ls)["partition"] for (n, ls), v in samples.items()
               if n == "fabric_partition_leader" and dict(ls)["topic"] == topic and v == 1}
    return {int(dict(ls)["partition"]): v for (n, ls), v in samples.items()
            if n == name and dict(ls)["topic"] == topic and dict(ls)["partition"] in leaders}


def test_scrape_during_load_counts_what_was_produced(cluster: LocalCluster, topic_name: str) -> None:
    urls = endpoints(cluster)
    assert set(urls) == set(cluster.nodes) and all(u.startswith("http://127.0.0.1:") for u in urls.values())
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=3)
    before = {node_id: scrape(url) for node_id, url in urls.items()}

    during: list[Samples] = []
    stop = threading.Event()

    def scrape_while_loading() -> None:
        while not stop.is_set():
            during.extend(scrape(url) for url in urls.values())
            time.sleep(0.2)

    scraper = threading.Thread(target=scrape_while_loading, daemon=True)
    scraper.start()
    try:
        with Producer(cluster.bootstrap, acks="all", linger_ms=2) as producer:
            for i in range(RECORDS):
                # Incompressible values, so bytes received must cover them even after lz4.
                producer.send(topic_name, os.urandom(VALUE_BYTES), partition=i % PARTITIONS)
            producer.flush(60)
    finally:
        stop.set()
        scraper.join(timeout=30)
    assert during, "no scrape succeeded while producing"

    # The state series are a snapshot the node refreshes every second: wait for it.
    deadline = time.monotonic() + SETTLE_S
    while True:
        after = {node_id: scrape(url) for node_id, url in urls.items()}
        ends = {p: v for s in after.values() for p, v in led(s, "fabric_partition_log_end_offset", topic_name).items()}
        hws = {p: v for s in after.values() for p, v in led(s, "fabric_partition_high_watermark", topic_name).items()}
        lag = sum(total(s, "fabric_replica_lag_messages", topic=topic_name) for s in after.values())
        if (sum(ends.values()) == RECORDS and sum(hws.values()) == RECORDS and lag == 0) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert ends == {p: RECORDS / PARTITIONS for p in range(PARTITIONS)}
    assert hws == ends and lag == 0
    isr = {p: v for s in after.values() for p, v in led(s, "fabric_partition_isr_size", topic_name).items()}
    assert isr == {p: 3 for p in range(PARTITIONS)}
    assert sum(total(s, "fabric_partition_under_replicated", topic=topic_name) for s in after.values()) == 0
    # Every replica (leader or follower) holds every record.
    replicas = [v for s in after.values() for (n, ls), v in s.items()
                if n == "fabric_partition_log_end_offset" and dict(ls)["topic"] == topic_name]
    assert sorted(replicas) == [RECORDS / PARTITIONS] * (3 * PARTITIONS)
    assert sum(total(s, "fabric_leader_partitions") for s in after.values()) >= PARTITIONS
    assert sum(total(s, "fabric_controller") for s in after.values()) == 1
    assert sum(total(s, "fabric_offline_partitions") for s in after.values()) == 0

    produce_requests = sum(total(s, "fabric_requests_total", api="PRODUCE") - total(before[n], "fabric_requests_total",
                                                                                       api="PRODUCE")
                           for n, s in after.items())
    assert 1 <= produce_requests <= RECORDS
    histogram_count = sum(total(s, "fabric_request_duration_seconds_count", api="PRODUCE") for s in after.values())
    assert histogram_count == sum(total(s, "fabric_requests_total", api="PRODUCE") for s in after.values())
    received = sum(total(s, "fabric_received_bytes_total") - total(before[n], "fabric_received_bytes_total")
                   for n, s in after.items())
    assert received >= RECORDS * VALUE_BYTES
    assert sum(total(s, "fabric_request_errors_total", api="PRODUCE") for s in after.values()) == 0
    assert all(total(s, "fabric_rocksdb_size_bytes") > 0 for s in after.values())
    # Every replica stores at least the incompressible values it holds.
    sizes = [v for s in after.values() for (n, ls), v in s.items()
             if n == "fabric_partition_size_bytes" and dict(ls)["topic"] == topic_name]
    assert len(sizes) == 3 * PARTITIONS and min(sizes) >= RECORDS / PARTITIONS * VALUE_BYTES

    # Group lag: commit offset GROUP_OFFSET everywhere; the coordinating node reports
    # high watermark - committed for each partition (it holds all of them here).
    with Admin(cluster.bootstrap) as admin:
        admin.reset_offsets("metrics-group", topic_name, to="offset", offset=GROUP_OFFSET)
    expected = {str(p): RECORDS / PARTITIONS - GROUP_OFFSET for p in range(PARTITIONS)}
    deadline = time.monotonic() + SETTLE_S
    while True:
        lag_by_partition = {dict(ls)["partition"]: v for s in (scrape(url) for url in urls.values())
                            for (n, ls), v in s.items()
                            if n == "fabric_group_lag_messages" and dict(ls)["group"] == "metrics-group"
                            and dict(ls)["topic"] == topic_name}
        if lag_by_partition == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert lag_by_partition == expected

    # The topic deleted and created again: the group's commits were made on the old one and
    # are no lag of the new one (they used to be reported against its high watermark).
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic(topic_name)
        admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=3)
    with Producer(cluster.bootstrap) as producer:
        for p in range(PARTITIONS):
            producer.send(topic_name, b"x" * VALUE_BYTES, partition=p).result(30)
    time.sleep(SNAPSHOT_WAIT_S)
    stale = {dict(ls)["partition"]: v for s in (scrape(url) for url in urls.values()) for (n, ls), v in s.items()
             if n == "fabric_group_lag_messages" and dict(ls)["group"] == "metrics-group"
             and dict(ls)["topic"] == topic_name}
    assert stale == {}

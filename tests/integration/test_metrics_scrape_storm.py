"""Bad scrapers cost a real node a bounded number of threads, and it keeps serving
(fabric/metrics_http.py caps its connections and renders one scrape at a time).

Before, each connection to a node's metrics port got a thread of its own, without limit
and without timeout: 500 clients that sent half a request held 500 threads in the node
(and took 77 s to connect). When they closed at once, the 500
threads woke together and held the node's loop off the GIL: 0.5 to 8 s ("loop stalled"),
once long enough for its ZooKeeper session to expire and its leaderships to move."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from fabric.metrics_http import CONNECTIONS_MAX
from sdk import Admin
from tests.conftest import make_cluster
from tests.fault.harness import wait_until
from tests.integration.test_metrics_endpoint import endpoints, scrape

PARTITIONS = 8
HELD_CONNECTIONS = 200
THREADS_SLACK = 4  # the node's own threads may come and go meanwhile (ZooKeeper jobs)
CONNECT_TIMEOUT_S = 10.0
SETTLE_S = 2.0  # for the node to start (or end) a connection's thread
SNAPSHOT_WAIT_S = 10.0  # several of the node's 1 s metric snapshots
STORM_TIMEOUT_S = 120.0
SCRAPERS = 100
REQUEST_SLOW_S = 1.0  # a METADATA answer this late means the loop was held up
# Concurrent scrapes from a process of their own (its threads do not compete with this
# process's GIL); it prints how many got a 200 and how many did not (503 or an error).
STORM = """
import sys, threading, urllib.request
url, count = sys.argv[1], int(sys.argv[2])
ok = []; failed = []
def scrape():
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read(); ok.append(r.status)
    except Exception as e:
        failed.append(repr(e))
threads = [threading.Thread(target=scrape) for _ in range(count)]
for t in threads: t.start()
for t in threads: t.join()
print(len(ok), len(failed))
"""


@pytest.fixture
def one_node(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    c = make_cluster(zk_server, tmp_path / "cluster", nodes=1)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def timed_metadata(admin: Admin) -> float:
    started = time.monotonic()
    admin.list_topics()
    return time.monotonic() - started


@pytest.mark.slow
def test_half_open_scrapers_and_a_burst_cost_the_node_bounded_threads(one_node: LocalCluster, topic_name: str) -> None:
    node = one_node.nodes[1]
    with Admin(one_node.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=1)
        (url,) = endpoints(one_node).values()
        host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
        wait_until(lambda: scrape(url)[("fabric_leader_partitions", ())] >= PARTITIONS,
                   "the node's snapshot of its leaderships", timeout_s=SNAPSHOT_WAIT_S)
        log_offset = (one_node.base_dir / "node1.log").stat().st_size
        threads_before = threads_of(node.process.pid)

        held: list[socket.socket] = []
        try:
            for _ in range(HELD_CONNECTIONS):  # each sends half a request line, then nothing
                s = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
                held.append(s)
                try:
                    s.sendall(b"GET /metr")
                except OSError:
                    pass  # over the cap the node has answered 503 and closed it already
            time.sleep(SETTLE_S)
            assert threads_of(node.process.pid) - threads_before <= CONNECTIONS_MAX + THREADS_SLACK
            with pytest.raises(urllib.error.HTTPError) as busy:
                urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT_S)
            assert busy.value.code == 503
            assert timed_metadata(admin) < REQUEST_SLOW_S
        finally:
            for s in held:
                s.close()
        time.sleep(SETTLE_S)
        assert timed_metadata(admin) < REQUEST_SLOW_S

        storm = subprocess.Popen([sys.executable, "-c", STORM, url, str(SCRAPERS)], stdout=subprocess.PIPE, text=True)
        try:
            out, _ = storm.communicate(timeout=STORM_TIMEOUT_S)
        finally:
            if storm.poll() is None:
                storm.kill()
                storm.wait()
        served, refused = (int(n) for n in out.split())
        assert served + refused == SCRAPERS and served >= CONNECTIONS_MAX
        assert timed_metadata(admin) < REQUEST_SLOW_S

    with open(one_node.base_dir / "node1.log", encoding="utf-8", errors="replace") as f:
        f.seek(log_offset)
        stalls = [line for line in f if "loop stalled" in line or "stepping down" in line]
    assert stalls == [], "".join(stalls)
    assert scrape(url)[("fabric_leader_partitions", ())] >= PARTITIONS

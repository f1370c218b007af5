"""A node closes a client connection that stops answering ZeroMQ's heartbeats, and only that.

A client whose host dies, or whose network goes, sends no FIN: without heartbeats the
node kept its connection, and the answers queued to it (up to the reply budget,
nodes/reply_budget.py), for as long as TCP keeps a silent connection. Here one client is
stopped with SIGSTOP (its libzmq I/O thread stops answering PINGs, as a dead host's would)
and another is alive but never reads its answers (its ZeroMQ still takes them off the
connection, into its receive queue, and answers the PINGs): the node closes the first
connection within the timeout, keeps the second (a slow reader is not a dead one), and
keeps serving.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Producer
from tests.conftest import make_cluster
from tests.fault.harness import wait_until
from tests.integration.helpers import leader_address

HEARTBEAT_TIMEOUT_MS = 1_000
ROOT = Path(__file__).resolve().parents[2]

# A client that pipelines fetches and never reads the answers, then waits to be stopped.
_UNREAD_FETCHER = """
import sys, time, zmq
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
address, topic = sys.argv[1], sys.argv[2]
request = apis.encode_request(ApiKey.FETCH, {
    "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
    "partitions": [{"topic": topic, "partition": 0, "fetch_offset": 0, "partition_bytes_max": 1 << 20,
                    "current_leader_epoch": -1}]}, 3)
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(address)
for _ in range(20):
    sock.send_multipart(request)
print("sent", flush=True)
time.sleep(120)
"""


@pytest.fixture
def heartbeat_cluster(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path / "cluster", nodes=1,
                           node_args=["--client-heartbeat-timeout-ms", str(HEARTBEAT_TIMEOUT_MS)])
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _established_from(port: int) -> set[int]:
    """Remote ports of the ESTABLISHED TCP connections whose local end is ``port`` (the
    node's ends of its client connections), from /proc/net/tcp and tcp6."""
    remotes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, remote, state = fields[1], fields[2], fields[3]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                    remotes.add(int(remote.rsplit(":", 1)[1], 16))
    return remotes


def test_a_stopped_client_is_disconnected_and_a_slow_one_is_not(heartbeat_cluster: LocalCluster,
                                                                  topic_name: str) -> None:
    cluster = heartbeat_cluster
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=1)
    with Producer(cluster.bootstrap, acks=1) as producer:
        for _ in range(200):
            producer.send(topic_name, os.urandom(1000), partition=0)
        producer.flush(30)
    address = leader_address(cluster.bootstrap, topic_name)
    port = int(address.rsplit(":", 1)[1])
    wait_until(lambda: not _established_from(port), "the producer's connections to close", 10)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    clients: list[subprocess.Popen[str]] = []
    ports: list[int] = []
    try:
        for _ in range(2):
            before = _established_from(port)
            client = subprocess.Popen([sys.executable, "-c", _UNREAD_FETCHER, address, topic_name], env=env,
                                      stdout=subprocess.PIPE, text=True)
            clients.append(client)
            assert client.stdout is not None and client.stdout.readline().strip() == "sent"
            wait_until(lambda before=before: len(_established_from(port) - before) == 1, "the client's connection", 10)
            (new,) = _established_from(port) - before
            ports.append(new)
        stopped, slow = ports
        os.kill(clients[0].pid, signal.SIGSTOP)
        wait_until(lambda: stopped not in _established_from(port),
                   "the node to close the connection of a client that stopped answering heartbeats",
                   10 * HEARTBEAT_TIMEOUT_MS / 1000)
        time.sleep(3 * HEARTBEAT_TIMEOUT_MS / 1000)  # well past the timeout
        assert slow in _established_from(port), "the node dropped a live client that only reads slowly"
        with Producer(cluster.bootstrap, acks=1) as producer:
            assert producer.send(topic_name, b"after", partition=0).result(10).offset == 200
    finally:
        for client in clients:
            os.kill(client.pid, signal.SIGCONT)
            client.kill()
            client.wait(10)


# A consumer that prints every value it reads, long-polling all the time.
_READER = """
import sys
from sdk import Consumer, TopicPartition
with Consumer(sys.argv[1], fetch_max_wait_ms=200) as consumer:
    consumer.assign([TopicPartition(sys.argv[2], 0)])
    consumer.seek_to_beginning()
    print("ready", flush=True)
    while True:
        for record in consumer.poll(timeout_ms=200):
            print(record.value.decode(), flush=True)
"""


def test_a_consumer_stopped_past_the_timeout_reads_again_at_once(heartbeat_cluster: LocalCluster,
                                                                  topic_name: str) -> None:
    """The node closes the connection of a consumer stopped past the timeout, and with it the
    answer to the fetch it had out. Resumed, the consumer's ZeroMQ reconnects by itself and
    its monitor reports the drop: it fetches again at once, not after request_timeout_ms
    (30 s), which it waited before."""
    cluster = heartbeat_cluster
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reader = subprocess.Popen([sys.executable, "-c", _READER, cluster.bootstrap, topic_name], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "ready"
        with Producer(cluster.bootstrap, acks=1) as producer:
            producer.send(topic_name, b"before", partition=0).result(10)
            assert reader.stdout.readline().strip() == "before"
            os.kill(reader.pid, signal.SIGSTOP)
            time.sleep(3 * HEARTBEAT_TIMEOUT_MS / 1000)  # its connection is closed meanwhile
            producer.send(topic_name, b"while-stopped", partition=0).result(10)
            os.kill(reader.pid, signal.SIGCONT)
            resumed = time.monotonic()
        assert reader.stdout.readline().strip() == "while-stopped"
        waited = time.monotonic() - resumed
        assert waited < 10, f"the resumed consumer read again only after {waited:.1f} s"
    finally:
        os.kill(reader.pid, signal.SIGCONT)
        reader.kill()
        reader.wait(10)

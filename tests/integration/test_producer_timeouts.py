"""The producer's documented time bounds against a real cluster that stops answering, and
a producer started while ZooKeeper cannot be reached.

``delivery_timeout_ms`` "holds in every state (no leader, no producer id, no answer)"
(``help(sdk.Producer)``): a record is failed with DeliveryTimeoutError once it is that old,
whatever the sender thread is doing meanwhile.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from fabric import errors
from fabric.local import LocalCluster, free_port
from sdk import Admin, Consumer, Producer, TopicPartition

DELIVERY_TIMEOUT_MS = 2_000
# Nodes are paused for less than the cluster's ZooKeeper session timeout (6 s), so they
# come back as they were; the old code failed the record only after 15 s or more.
PAUSE_S_MAX = 4.5


def _send_while_paused(cluster: LocalCluster, producer: Producer, topic: str) -> tuple[BaseException | None, float]:
    """Send one record while every node is paused (it takes connections, never answers);
    what it failed with, and after how long."""
    for node in cluster.nodes.values():
        node.pause()
    try:
        started = time.monotonic()
        future = producer.send(topic, b"never answered", partition=0)
        return future.exception(timeout=PAUSE_S_MAX), time.monotonic() - started
    finally:
        for node in cluster.nodes.values():
            node.resume()


def test_delivery_timeout_holds_while_no_node_answers_metadata(cluster: LocalCluster, topic_name: str) -> None:
    """The record in flight must fail at about ``delivery_timeout_ms``. The sender thread
    used to sit in a metadata refresh of 3 passes x 3 nodes x 5 s and failed it only after
    15-20 s."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=1_000,
                  delivery_timeout_ms=DELIVERY_TIMEOUT_MS) as producer:
        producer.send(topic_name, b"warm", partition=0).result(timeout=30)  # producer id and map known
        exc, waited_s = _send_while_paused(cluster, producer, topic_name)
        assert isinstance(exc, errors.DeliveryTimeoutError), exc
        assert waited_s < DELIVERY_TIMEOUT_MS / 1000 + 1.5


def test_idempotent_partition_goes_on_after_a_delivery_timeout(cluster: LocalCluster, topic_name: str) -> None:
    """A batch failed by its delivery timeout while its request was unanswered may or may
    not be stored. The next batch of the partition took the next sequence number, and when
    the node had not stored the lost one it refused that one and every later one with
    OUT_OF_ORDER_SEQUENCE, final: the partition was dead for this producer. Now its next
    batch starts a new epoch (as Kafka's KIP-360), and nothing is written twice."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(cluster.bootstrap, linger_ms=0, request_timeout_ms=1_000,
                  delivery_timeout_ms=DELIVERY_TIMEOUT_MS) as producer:
        producer.send(topic_name, b"warm", partition=0).result(timeout=30)
        exc, _ = _send_while_paused(cluster, producer, topic_name)
        assert isinstance(exc, errors.DeliveryTimeoutError), exc
        after = [producer.send(topic_name, f"after-{i}".encode(), partition=0).result(timeout=30) for i in range(3)]
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        consumer.seek_to_beginning()
        values = [r.value for r in consumer.poll(timeout_ms=5_000)]
    # The paused node may have taken the lost request after all: then it is there once.
    assert values in ([b"warm", b"after-0", b"after-1", b"after-2"],
                      [b"warm", b"never answered", b"after-0", b"after-1", b"after-2"]), values
    assert [m.offset for m in after] == list(range(len(values) - 3, len(values)))


class _Forwarder:
    """A TCP port that forwards to ZooKeeper once ``open()`` is called: before, nothing
    listens there, as with a ZooKeeper that is down (a real outage of the real path)."""

    def __init__(self, port: int, target: str) -> None:
        host, target_port = target.split("/")[0].rsplit(":", 1)
        self.port, self.target = port, (host, int(target_port))
        self._server: socket.socket | None = None
        self._sockets: list[socket.socket] = []

    def open(self) -> None:
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        for s in [*self._sockets, *([self._server] if self._server else [])]:
            s.close()


def test_producer_started_while_zookeeper_is_down_sends_once_it_is_back(
        cluster: LocalCluster, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """README: a client started while ZooKeeper is away cannot get the routing map until it
    is back. The sender thread's first ask for a producer id found no node address and
    ZooKeeper silent; that NoBrokersAvailableError killed the thread ("producer sender
    thread died" with a traceback), and the producer refused every send() for good."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    port = free_port()
    chroot = cluster.zk_address[cluster.zk_address.index("/"):]
    forwarder = _Forwarder(port, cluster.zk_address)
    caplog.set_level(logging.WARNING, logger="fabric.producer")
    try:
        with Producer(f"zk://127.0.0.1:{port}{chroot}", linger_ms=0) as producer:
            # Two failures: the sender's first metadata refresh, then its ask for a producer id.
            deadline = time.monotonic() + 30
            while len([r for r in caplog.records if r.name == "fabric.producer"]) < 2:
                assert time.monotonic() < deadline, "the producer never tried ZooKeeper"
                time.sleep(0.1)
            forwarder.open()
            metadata = producer.send(topic_name, b"after the outage", partition=0).result(timeout=30)
            assert metadata.offset == 0
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a background thread died"
    finally:
        forwarder.close()

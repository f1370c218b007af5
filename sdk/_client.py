"""Connections, bootstrap and the client's view of the routing map.

Each SDK object owns its sockets and uses them from one thread (ZeroMQ sockets are not
thread-safe): the producer from its sender thread, the consumer and admin from the
caller's thread.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import zmq

from fabric import errors
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey, Message

DEFAULT_REQUEST_TIMEOUT_MS = 30_000
METADATA_TIMEOUT_MS = 5_000
SOCKET_HWM = 10_000


@dataclass(frozen=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"


@dataclass(frozen=True)
class PartitionMetadata:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    partitions: tuple[PartitionMetadata, ...]
    message_bytes_max: int
    strict_order: bool = False

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


@dataclass
class ClusterMetadata:
    nodes: dict[int, str] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    controller_id: int = -1
    fetched_at: float = 0.0  # monotonic seconds

    def leader_address(self, topic: str, partition: int) -> str | None:
        meta = self.topics.get(topic)
        if meta is None or partition >= len(meta.partitions):
            return None
        return self.nodes.get(meta.partitions[partition].leader)


class Bootstrap:
    """``tcp://h:p,tcp://h:p`` (or ``h:p,h:p``): node addresses; ``zk://h:p[/chroot]``:
    ZooKeeper, from which the live nodes' addresses are read."""

    def __init__(self, spec: str | Iterable[str]) -> None:
        if isinstance(spec, str):
            parts = [p.strip() for p in spec.split(",") if p.strip()]
        else:
            parts = [p.strip() for p in spec if p.strip()]
        if not parts:
            raise ValueError("bootstrap is empty: give node addresses or zk://host:port")
        self.zk: str | None = None
        self.addresses: list[str] = []
        if parts[0].startswith("zk://"):
            self.zk = ",".join(p.removeprefix("zk://") for p in parts)
        else:
            self.addresses = [p if "://" in p else f"tcp://{p}" for p in parts]

    def node_addresses(self) -> list[str]:
        if self.zk is None:
            return list(self.addresses)
        from kazoo.client import KazooClient

        from fabric import zk as zkl

        client = KazooClient(hosts=self.zk)
        try:
            client.start(timeout=METADATA_TIMEOUT_MS / 1000)
        except Exception as exc:
            raise errors.NoBrokersAvailableError(f"ZooKeeper {self.zk} did not answer: {exc}") from exc
        try:
            return [n.address for _, n in sorted(zkl.live_nodes(client).items())]
        finally:
            client.stop()
            client.close()


class Connections:
    """DEALER sockets by node address, with correlation ids and a poller."""

    def __init__(self, context: zmq.Context[Any] | None = None) -> None:
        self.ctx = context or zmq.Context.instance()
        self.sockets: dict[str, zmq.Socket[Any]] = {}
        self.by_socket: dict[zmq.Socket[Any], str] = {}
        self.poller = zmq.Poller()
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids) & 0xFFFFFFFF

    def socket(self, address: str) -> zmq.Socket[Any]:
        sock = self.sockets.get(address)
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
            sock.setsockopt(zmq.RCVHWM, SOCKET_HWM)
            sock.setsockopt(zmq.MAXMSGSIZE, 256 * 1024 * 1024)
            # Without IMMEDIATE a DEALER queues to a peer that is not there; with it a
            # send to a dead node fails fast and we try another route.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.connect(address)
            self.sockets[address] = sock
            self.by_socket[sock] = address
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def send(self, address: str, frames: list[Any], *, wait_connect_ms: int = 1_000) -> None:
        """Send without blocking forever: a node that is down raises NodeNotReadyError."""
        sock = self.socket(address)
        deadline = time.monotonic() + wait_connect_ms / 1000.0
        while True:
            try:
                sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                if time.monotonic() >= deadline:
                    raise errors.NodeNotReadyError(f"node {address} is not reachable") from None
                time.sleep(0.005)

    def drop(self, address: str) -> None:
        """Close a socket, discarding anything queued on it (after a timeout)."""
        sock = self.sockets.pop(address, None)
        if sock is not None:
            self.by_socket.pop(sock, None)
            self.poller.unregister(sock)
            sock.close(linger=0)

    def poll(self, timeout_ms: int) -> list[tuple[str, list[Any]]]:
        out: list[tuple[str, list[Any]]] = []
        if not self.sockets:
            time.sleep(max(0, timeout_ms) / 1000.0)
            return out
        for sock, _ in self.poller.poll(max(0, timeout_ms)):
            address = self.by_socket.get(sock)
            if address is None:
                continue
            while True:
                try:
                    out.append((address, sock.recv_multipart(zmq.NOBLOCK, copy=False)))
                except zmq.Again:
                    break
        return out

    def request(self, address: str, api_key: int, body: dict[str, Any], *, timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                batches: list[bytes] | None = None) -> Message:
        """One synchronous request; other responses that arrive meanwhile are dropped."""
        correlation_id = self.next_id()
        self.send(address, apis.encode_request(api_key, body, correlation_id, batches=batches))
        deadline = time.monotonic() + timeout_ms / 1000.0
        sock = self.sockets[address]
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                self.drop(address)
                raise errors.RequestTimedOutError(f"{ApiKey(api_key).name} to {address} timed out after {timeout_ms} ms")
            if not sock.poll(remaining_ms):
                continue
            frames = sock.recv_multipart(copy=False)
            message = apis.decode_response([f.bytes if i < 2 else f.buffer for i, f in enumerate(frames)])
            if message.header.correlation_id != correlation_id:
                continue
            if message.header.error_code:
                errors.raise_for_code(message.header.error_code, message.body.get("message", ""))
            return message

    def close(self) -> None:
        for address in list(self.sockets):
            self.drop(address)


class MetadataClient:
    """Fetches the routing map from any reachable node, trying bootstrap addresses in turn."""

    def __init__(self, bootstrap: Bootstrap, connections: Connections) -> None:
        self.bootstrap = bootstrap
        self.connections = connections
        self.metadata = ClusterMetadata()
        self._known: list[str] = []

    def candidates(self) -> list[str]:
        seen = list(dict.fromkeys([*self.metadata.nodes.values(), *self._known]))
        if not seen:
            self._known = self.bootstrap.node_addresses()
            seen = list(self._known)
        return seen

    def refresh(self, topics: list[str] | None = None, *, timeout_ms: int = METADATA_TIMEOUT_MS) -> ClusterMetadata:
        last: Exception | None = None
        for attempt in range(2):
            candidates = self.candidates() if attempt == 0 else self._rediscover()
            for address in candidates:
                try:
                    message = self.connections.request(
                        address, ApiKey.METADATA, {"topics": topics or []}, timeout_ms=timeout_ms
                    )
                except errors.FabricError as exc:
                    last = exc
                    continue
                self.metadata = self._parse(message.body, merge=bool(topics))
                return self.metadata
        raise errors.NoBrokersAvailableError(f"no node answered a metadata request (last error: {last})")

    def _rediscover(self) -> list[str]:
        self.metadata.nodes.clear()
        self._known = self.bootstrap.node_addresses()
        return list(self._known)

    def _parse(self, body: dict[str, Any], *, merge: bool) -> ClusterMetadata:
        nodes = {n["node_id"]: n["address"] for n in body["nodes"]}
        topics = dict(self.metadata.topics) if merge else {}
        for t in body["topics"]:
            if t["error"]:
                topics.pop(t["name"], None)
                continue
            topics[t["name"]] = TopicMetadata(
                t["name"],
                tuple(
                    PartitionMetadata(p["partition"], p["leader"], p["leader_epoch"], tuple(p["replicas"]), tuple(p["isr"]))
                    for p in t["partitions"]
                ),
                t["message_bytes_max"],
                bool(t["strict_order"]),
            )
        return ClusterMetadata(nodes, topics, body["controller_id"], time.monotonic())

    def topic(self, name: str, *, refresh_if_missing: bool = True) -> TopicMetadata:
        meta = self.metadata.topics.get(name)
        if meta is None and refresh_if_missing:
            self.refresh([name])
            meta = self.metadata.topics.get(name)
        if meta is None:
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return meta

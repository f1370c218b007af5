"""The control plane's ZooKeeper work at many partitions (real ZooKeeper).

Reads and writes of every partition state are pipelined, each write its own fence. A
failed node's leaderships used to move at six serial round trips per partition (the live
nodes read again for each), 19-31 s for 667 partitions at 2,000 in the cluster: longer than
a draining node's followers keep acking it. A node's routing-map resync and `fabric
status` also read one partition state per round trip (docs/BENCHMARKS.md, "Many
partitions"). Those tests record the order of requests sent and answers awaited:
serially it is send, wait, send, wait; pipelined, a batch's sends come first.

A topic whose creation is larger than ZooKeeper takes in one request is refused before it
is sent: ZooKeeper drops the connection such a request came on.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError

from fabric import zk as zkl
from fabric.local import LocalZooKeeper
from nodes import controller

PARTITIONS = 60


@pytest.fixture
def zk_address(zk_server: LocalZooKeeper) -> str:
    chroot = f"/fabric-test-{uuid.uuid4().hex[:12]}"
    zk = zkl.make_client(zk_server.address)
    zk.start(timeout=zkl.ZK_START_TIMEOUT_S)
    try:
        zkl.ensure_path(zk, chroot)
    finally:
        zkl.close_client(zk)
    return zk_server.address + chroot


def client(address: str) -> KazooClient:
    zk = zkl.make_client(address)
    zk.start(timeout=zkl.ZK_START_TIMEOUT_S)
    return zk


@pytest.fixture
def zk(zk_address: str) -> Iterator[KazooClient]:
    zk = client(zk_address)
    try:
        zkl.ensure_layout(zk)
        yield zk
    finally:
        zkl.close_client(zk)


class Recorded:
    """An async result that notes when someone waits for it."""

    def __init__(self, result: Any, events: list[str]) -> None:
        self._result, self._events = result, events

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        self._events.append("wait")
        return self._result.get(block, timeout)

    def rawlink(self, callback: Any) -> None:  # answered on kazoo's thread: nobody waits
        self._result.rawlink(callback)


def record_requests(zk: KazooClient, events: list[str]) -> None:
    """Note each get and set sent, and each wait for an answer, in order."""
    for name in ("get_async", "set_async"):
        send = getattr(zk, name)

        def recorded(*args: Any, _send: Any = send, **kwargs: Any) -> Recorded:
            events.append("send")
            return Recorded(_send(*args, **kwargs), events)

        setattr(zk, name, recorded)


def longest_run_of_sends(events: list[str]) -> int:
    longest = run = 0
    for event in events:
        run = run + 1 if event == "send" else 0
        longest = max(longest, run)
    return longest


def test_a_failed_nodes_leaderships_move_in_pipelined_reads_and_writes(zk: KazooClient, zk_address: str) -> None:
    for node_id in (1, 2, 3):
        zkl.create(zk, zkl.node_path(node_id), zkl.NodeInfo(node_id, f"tcp://127.0.0.1:{node_id}").encode())
    zkl.create_topic(zk, "t", PARTITIONS, 3, {})
    zk.delete(zkl.node_path(1))  # node 1 fails
    led_by_1 = {p for p in range(PARTITIONS)
                if zkl.PartitionState.decode(p, zkl.get(zk, zkl.partition_path("t", p))[0]).leader == 1}
    assert led_by_1
    routing = zkl.RoutingCache(zk)
    routing.start()
    routing.resync()
    controller_zk = client(zk_address)  # its own client: the routing cache's watches read on the other
    events: list[str] = []
    record_requests(controller_zk, events)
    node = SimpleNamespace(zk=controller_zk, routing=routing, controller_dirty=False, routing_dirty=False)
    try:
        controller.reconcile_leaders(node)  # type: ignore[arg-type]
    finally:
        routing.close()
        zkl.close_client(controller_zk)
    for p in range(PARTITIONS):
        raw, stat = zkl.get(zk, zkl.partition_path("t", p))
        state = zkl.PartitionState.decode(p, raw, stat.version)
        if p in led_by_1:
            assert state.leader in (2, 3) and 1 not in state.isr
        else:
            assert state.version == 0  # its leader lives: untouched
    assert node.routing_dirty and not node.controller_dirty
    # Every read went out before the first answer was awaited, and then every write:
    # serially it was send, wait, send, wait (a run of one).
    assert longest_run_of_sends(events) >= len(led_by_1)


def test_pipelined_writes_fence_each_partition_alone(zk: KazooClient) -> None:
    for name in ("a", "b"):
        zkl.create(zk, f"{zkl.ROOT}/{name}", b"0")
    zkl.set_data(zk, f"{zkl.ROOT}/b", b"1")  # b is now at version 1
    results = zkl.set_many(zk, [(f"{zkl.ROOT}/a", b"x", 0), (f"{zkl.ROOT}/b", b"x", 0)])
    assert results[0].version == 1 and isinstance(results[1], BadVersionError)
    reads = zkl.get_many(zk, [f"{zkl.ROOT}/a", f"{zkl.ROOT}/b", f"{zkl.ROOT}/missing"])
    assert [r[0] for r in reads[:2]] == [b"x", b"1"]
    assert type(reads[2]).__name__ == "NoNodeError"


def test_a_routing_map_resync_reads_the_partition_states_pipelined(zk: KazooClient, zk_address: str) -> None:
    for node_id in (1, 2, 3):
        zkl.create(zk, zkl.node_path(node_id), zkl.NodeInfo(node_id, f"tcp://127.0.0.1:{node_id}").encode())
    zkl.create_topic(zk, "t", PARTITIONS, 3, {})
    zkl.create_topic(zk, "u", 2, 3, {})
    reader = client(zk_address)
    events: list[str] = []
    routing = zkl.RoutingCache(reader)
    try:
        routing.start()
        deadline = time.monotonic() + 30
        # The watches' own first reads (serial, on kazoo's thread) must be over before we record.
        while sum(len(route.partitions) for route in routing.topics().values()) < PARTITIONS + 2:
            assert time.monotonic() < deadline, "the routing cache's watches never read every partition"
            time.sleep(0.01)
        record_requests(reader, events)
        routing.resync()  # what a node does after a stall or a new session
    finally:
        routing.close()
        zkl.close_client(reader)
    topics = routing.topics()
    assert sorted(topics) == ["t", "u"] and len(topics["t"].partitions) == PARTITIONS
    assert all(topics["t"].partitions[p].leader in (1, 2, 3) for p in range(PARTITIONS))
    assert longest_run_of_sends(events) >= PARTITIONS + 2  # serially: a run of one


def test_fabric_status_reads_the_partition_states_pipelined(zk: KazooClient, zk_address: str) -> None:
    from fabric.cli.status import collect

    for node_id in (1, 2, 3):
        zkl.create(zk, zkl.node_path(node_id), zkl.NodeInfo(node_id, f"tcp://127.0.0.1:{node_id}").encode())
    zkl.create_topic(zk, "t", PARTITIONS, 3, {})
    zk.delete(zkl.node_path(3))
    reader = client(zk_address)
    events: list[str] = []
    record_requests(reader, events)
    try:
        status = collect(reader, zk_address)
    finally:
        zkl.close_client(reader)
    assert (status.topics, status.partitions) == (1, PARTITIONS)
    assert len(status.offline) == sum(1 for p in range(PARTITIONS) if zkl.PartitionState.decode(
        p, zkl.get(zk, zkl.partition_path("t", p))[0]).leader == 3)
    assert longest_run_of_sends(events) >= PARTITIONS


def test_a_topic_too_large_for_one_zookeeper_request_is_refused_and_the_connection_kept(zk: KazooClient) -> None:
    from fabric import errors

    for node_id in (1, 2, 3):
        zkl.create(zk, zkl.node_path(node_id), zkl.NodeInfo(node_id, f"tcp://127.0.0.1:{node_id}").encode())
    with pytest.raises(errors.InvalidPartitionsError, match=r"ZooKeeper transaction of [0-9,]+ bytes"):
        zkl.create_topic(zk, "huge", 9_000, 3, {})  # about 1.5 MB: over jute.maxbuffer
    assert zk.connected and zk.exists(zkl.topic_path("huge")) is None
    zkl.create_topic(zk, "grown", 4_000, 3, {})  # about 0.7 MB: one request
    with pytest.raises(errors.InvalidPartitionsError, match="ZooKeeper transaction"):
        zkl.add_partitions(zk, "grown", 10_000)
    assert zk.connected and zkl.TopicConfig.decode(zkl.get(zk, zkl.topic_path("grown"))[0]).partitions == 4_000
    # The estimate is the request's real size: a topic just under the limit is created.
    fits = next(n for n in range(6_500, 4_000, -100) if _bytes(zk, "fits", n) <= zkl.ZK_REQUEST_BYTES_MAX)
    zkl.create_topic(zk, "fits", fits, 3, {})
    assert zk.connected


def _bytes(zk: KazooClient, name: str, partitions: int) -> int:
    """What ``create_topic`` would send for ``name``, by its own estimate."""
    state = zkl.PartitionState(0, (1, 2, 3), 1, 1_000_000_000, (1, 2, 3)).encode()  # the longest epoch
    config = zkl.TopicConfig.build(partitions, 3, {}, 1_700_000_000_000).encode()
    return (zkl.create_op_bytes(zk, zkl.topic_path(name), config) + zkl.create_op_bytes(zk, zkl.partitions_path(name), b"")
            + sum(zkl.create_op_bytes(zk, zkl.partition_path(name, p), state) for p in range(partitions)))


def test_a_burst_of_partition_changes_reaches_the_routing_map_in_pipelined_reads(
        zk: KazooClient, zk_address: str) -> None:
    """A failover changes hundreds of partition states at once; kazoo's DataWatch re-read each
    and waited for the answer before the next, about 10 ms a read on a busy node (7 s for 667)."""
    for node_id in (1, 2, 3):
        zkl.create(zk, zkl.node_path(node_id), zkl.NodeInfo(node_id, f"tcp://127.0.0.1:{node_id}").encode())
    zkl.create_topic(zk, "t", PARTITIONS, 3, {})
    reader = client(zk_address)
    routing = zkl.RoutingCache(reader)
    events: list[str] = []

    def leaders() -> set[int]:
        route = routing.topics().get("t")
        return {state.leader for state in route.partitions.values()} if route and len(route.partitions) == PARTITIONS \
            else set()

    def move_all_to(leader: int) -> None:
        reads = zkl.get_many(zk, [zkl.partition_path("t", p) for p in range(PARTITIONS)])
        states = [zkl.PartitionState.decode(p, raw, stat.version) for p, (raw, stat) in enumerate(reads)]
        moved = [dataclasses.replace(s, leader=leader, leader_epoch=s.leader_epoch + 1) for s in states]
        written = zkl.set_many(zk, [(zkl.partition_path("t", s.partition), s.encode(), s.version) for s in moved])
        assert not [r for r in written if isinstance(r, Exception)]

    def wait_for(wanted: set[int]) -> None:
        deadline = time.monotonic() + 30
        while leaders() != wanted:
            assert time.monotonic() < deadline, f"the routing map shows leaders {leaders()}, not {wanted}"
            time.sleep(0.01)

    try:
        routing.start()
        wait_for({1, 2, 3})
        record_requests(reader, events)
        move_all_to(2)
        wait_for({2})
        move_all_to(3)  # every partition is watched again after its change
        wait_for({3})
    finally:
        routing.close()
        zkl.close_client(reader)
    assert events.count("send") >= 2 * PARTITIONS and "wait" not in events  # nobody waits for a re-read


def test_isr_writes_in_one_pipelined_batch_each_fenced_by_version_and_incarnation(zk: KazooClient) -> None:
    for node_id in (1, 2, 3):
        zkl.create(zk, zkl.node_path(node_id), zkl.NodeInfo(node_id, f"tcp://127.0.0.1:{node_id}").encode())
    a = zkl.create_topic(zk, "a", 3, 3, {})
    zkl.create_topic(zk, "b", 1, 3, {})

    def read(topic: str, p: int) -> zkl.PartitionState:
        raw, stat = zkl.get(zk, zkl.partition_path(topic, p))
        return zkl.PartitionState.decode(p, raw, stat.version)

    stale = read("a", 2)
    zkl.write_partition_state(zk, "a", dataclasses.replace(stale, isr=stale.isr[:2]))  # someone else wrote a/2
    shrink = [dataclasses.replace(read("a", p), isr=(1, 2)) for p in range(2)]
    results = zkl.write_partition_states(zk, [
        ("a", shrink[0], a.created_ms), ("a", shrink[1], a.created_ms),
        ("a", dataclasses.replace(stale, isr=(1,)), a.created_ms),  # an old version
        ("b", dataclasses.replace(read("b", 0), isr=(1,)), a.created_ms),  # another topic's incarnation
    ])
    assert [type(r).__name__ for r in results] == ["PartitionState", "PartitionState", "BadVersionError",
                                                   "BadVersionError"]
    assert results[0].version == 1 and read("a", 0).isr == (1, 2) and read("a", 1).isr == (1, 2)
    assert len(read("b", 0).isr) == 3 and read("a", 2).version == 1

"""A move to fewer copies racing a raise of the topic's ``min_insync`` (real ZooKeeper, no
node processes): the controller's raise of an internal topic's config
(``reassign.raise_internal_config``), ALTER_TOPIC_CONFIGS (``zkl.alter_topic_config``) and
REASSIGN_PARTITION (``reassign._begin_in_zookeeper``) each read, decide and commit; each
test runs one of them to its commit with the other done in between (a hook on the read
it decides from), as two nodes' ZooKeeper workers could interleave them. Before, the
shrink was checked against the node's cached ``min_insync`` and committed whatever the
config had become, and the alter did not notice a shrink after its read: either left
``min_insync`` 2 on a partition moving to one copy, whose acks=all writes were then all
refused until it was moved back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.client import KazooClient

from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalZooKeeper
from nodes import reassign

OFFSETS = "__consumer_offsets"


@pytest.fixture
def zk(zk_server: LocalZooKeeper) -> Iterator[KazooClient]:
    """A client in a chroot of its own, with nodes 1 and 2 registered."""
    root = zkl.make_client(zk_server.address)
    root.start(timeout=zkl.ZK_START_TIMEOUT_S)
    chroot = f"/fabric-test-{uuid.uuid4().hex[:12]}"
    try:
        zkl.ensure_path(root, chroot)
    finally:
        zkl.close_client(root)
    client = zkl.make_client(zk_server.address + chroot)
    client.start(timeout=zkl.ZK_START_TIMEOUT_S)
    try:
        zkl.ensure_layout(client)
        for node_id in (1, 2):
            zkl.create(client, zkl.node_path(node_id), zkl.NodeInfo(node_id, f"tcp://127.0.0.1:{node_id}").encode())
        yield client
    finally:
        zkl.close_client(client)


@pytest.fixture
def node(zk: KazooClient) -> Iterator[SimpleNamespace]:
    """What the controller's handlers use of a NodeState: its client and its routing map."""
    routing = zkl.RoutingCache(zk)
    routing.start()
    try:
        yield SimpleNamespace(zk=zk, routing=routing, controller_dirty=False, routing_dirty=False)
    finally:
        routing.close()


def state(zk: KazooClient, topic: str, p: int) -> zkl.PartitionState:
    raw, stat = zkl.get(zk, zkl.partition_path(topic, p))
    return zkl.PartitionState.decode(p, raw, stat.version)


def config(zk: KazooClient, topic: str) -> tuple[zkl.TopicConfig, int]:
    raw, stat = zkl.get(zk, zkl.topic_path(topic))
    return zkl.TopicConfig.decode(raw), stat.version


def grown_offsets_topic(node: SimpleNamespace) -> None:
    """__consumer_offsets made on one node (replication_factor 1, min_insync 1), each
    partition since grown to nodes 1 and 2: the controller's raise would make it (2, 2)."""
    zkl.create_topic(node.zk, OFFSETS, 2, 1, {})
    for p in range(2):
        zkl.write_partition_state(node.zk, OFFSETS, zkl.PartitionState(p, (1, 2), 1, 1, (1, 2),
                                                                       version=state(node.zk, OFFSETS, p).version))
    node.routing.resync()
    made, _version = config(node.zk, OFFSETS)
    assert (made.replication_factor, made.min_insync) == (1, 1)


def once(monkeypatch: pytest.MonkeyPatch, name: str, between: Callable[[], object], *, after: bool) -> None:
    """Make ``zkl.<name>`` run ``between`` the first time it is called (before or after
    its real work): the point where the call under test has read what it decides from."""
    real = getattr(zkl, name)
    done: list[bool] = []

    def hooked(*args: Any, **kwargs: Any) -> Any:
        if not done and not after:
            done.append(True)
            between()
        out = real(*args, **kwargs)
        if not done and after:
            done.append(True)
            between()
        return out

    monkeypatch.setattr(zkl, name, hooked)


def test_a_shrink_decided_before_a_raise_commits_is_refused_against_the_raised_min_insync(
        node: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shrink reads the config (min_insync 1) and the partition; the controller's raise
    commits (2, 2); the shrink's commit fails its config check, and its second decision,
    on min_insync 2, refuses one copy and changes nothing. Before, it moved the partition
    to one copy under min_insync 2."""
    grown_offsets_topic(node)
    before = state(node.zk, OFFSETS, 0)
    # The shrink reads the live nodes after the config and the partition state.
    once(monkeypatch, "live_nodes", lambda: reassign.raise_internal_config(node, OFFSETS), after=False)  # type: ignore[arg-type]
    answer = reassign._begin_in_zookeeper(node, OFFSETS, 0, (1,), 0)  # type: ignore[arg-type]
    raised, _version = config(node.zk, OFFSETS)
    assert (raised.replication_factor, raised.min_insync) == (2, 2)
    assert answer["error"] == errors.InvalidReplicationFactorError.code, answer
    assert "min_insync=2" in answer["message"]
    assert state(node.zk, OFFSETS, 0) == before  # nothing moved


def test_a_raise_decided_before_a_shrink_commits_fails_and_is_not_decided_again(
        node: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """The raise reads the config and the partition states (two copies each); a shrink of
    partition 0 to one copy commits under min_insync 1; the raise's commit fails, and the
    next round's decision, on the moving partition's one settled copy, raises nothing."""
    grown_offsets_topic(node)

    def shrink() -> None:
        assert reassign._begin_in_zookeeper(node, OFFSETS, 0, (1,), 0) == {"error": 0, "message": ""}  # type: ignore[arg-type]

    once(monkeypatch, "read_partition_states", shrink, after=True)
    reassign.raise_internal_config(node, OFFSETS)  # type: ignore[arg-type]
    assert node.controller_dirty  # a race: the next round decides again
    moving = state(node.zk, OFFSETS, 0)
    assert (moving.replicas, moving.removing) == ((1, 2), (2,))
    reassign.raise_internal_config(node, OFFSETS)  # type: ignore[arg-type]
    kept, _version = config(node.zk, OFFSETS)
    assert (kept.replication_factor, kept.min_insync) == (1, 1)


def test_an_alter_decided_before_a_shrink_commits_is_refused_against_the_copies_left(
        node: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's topic of two copies, min_insync 1: `fabric topic alter` reads its copies (2);
    a shrink of its partition to one copy commits, rewriting the config unchanged (its
    version moves on, a move to more copies only checks it); the alter's commit fails its
    version check and its second decision, on one copy, refuses min_insync 2. Before, the
    alter committed min_insync 2 over the partition moving to one copy."""
    zkl.create_topic(node.zk, "events", 1, 2, {"min_insync": "1"})
    node.routing.resync()
    made, made_version = config(node.zk, "events")
    reordered = reassign._begin_in_zookeeper(node, "events", 0, tuple(reversed(state(node.zk, "events", 0).replicas)), 0)  # type: ignore[arg-type]
    assert reordered["error"] == 0 and config(node.zk, "events")[1] == made_version  # as many copies: only checked

    def shrink() -> None:
        assert reassign._begin_in_zookeeper(node, "events", 0, (1,), 0) == {"error": 0, "message": ""}  # type: ignore[arg-type]

    once(monkeypatch, "read_partition_states", shrink, after=True)
    with pytest.raises(errors.InvalidConfigError, match="min_insync=2"):
        zkl.alter_topic_config(node.zk, "events", {"min_insync": "2"})
    kept, kept_version = config(node.zk, "events")
    assert kept == made and kept_version == made_version + 1  # the shrink's rewrite, nothing else
    assert state(node.zk, "events", 0).removing == (2,)

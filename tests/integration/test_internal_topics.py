"""Fabric's internal topics (``__consumer_offsets``, ``__queue_state``): the coordinators'
state, replayed by every new leader. Clients may read them, never write, create, delete or
grow them; and a record the coordinator cannot read costs that record, not the node.

Found by producing a garbage key into ``__consumer_offsets`` with the SDK: the write was
acknowledged, and from the next leader change on, every node that took the partition
stopped while loading it (UnicodeDecodeError), at every restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fabric import errors
from fabric.local import LocalCluster, LocalZooKeeper
from fabric.protocol import apis, batch
from fabric.protocol import groups as group_format
from fabric.protocol import queues as qp
from fabric.protocol.apis import ApiKey
from sdk import Admin, Consumer, Producer, QueueConsumer, TopicPartition
from tests.conftest import make_cluster
from tests.integration.helpers import decode, leader_address, leader_id, raw_request

FAST = {"heartbeat_interval_ms": 300, "session_timeout_ms": 6_000}


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    with Consumer(bootstrap, group_id=group, enable_auto_commit=False, **FAST) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.commit({TopicPartition(topic, 0): offset})


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    with Consumer(bootstrap, group_id=group, enable_auto_commit=False, **FAST) as consumer:
        return consumer.committed(TopicPartition(topic, 0))


def test_clients_may_not_write_create_delete_or_grow_internal_topics(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    _commit(bootstrap, f"g-{topic_name}", topic_name, 3)  # the coordinator has made __consumer_offsets
    offsets = group_format.OFFSETS_TOPIC

    with Producer(bootstrap) as producer, pytest.raises(errors.InvalidTopicError, match="internal"):
        producer.send(offsets, b"garbage", key=b"o\xff\xfe", partition=0).result(30)
    with Admin(bootstrap) as admin:
        with pytest.raises(errors.InvalidTopicError, match="internal"):
            admin.delete_topic(offsets)
        with pytest.raises(errors.InvalidTopicError, match="internal"):
            admin.create_partitions(offsets, group_format.OFFSETS_TOPIC_PARTITIONS + 1)
        with pytest.raises(errors.InvalidTopicError, match="internal"):
            admin.create_topic("__queue_state", partitions=1)
        with pytest.raises(errors.InvalidTopicError, match="internal"):
            admin.create_topic("__mine", partitions=1)
        assert len(admin.describe_topic(offsets).partitions) == group_format.OFFSETS_TOPIC_PARTITIONS
        assert "__mine" not in admin.list_topics()

    # Nothing changed: the group's offset is where it was, and it still commits.
    assert _committed(bootstrap, f"g-{topic_name}", topic_name) == 3
    _commit(bootstrap, f"g-{topic_name}", topic_name, 5)
    assert _committed(bootstrap, f"g-{topic_name}", topic_name) == 5

    # A node lists the PRODUCE and CREATE_TOPIC versions it takes, and only the APIs it
    # serves (ALLOCATE_IDS is the sequencer's).
    address = leader_address(bootstrap, topic_name)
    versions = decode(raw_request(address, apis.encode_request(ApiKey.API_VERSIONS, {}, 3))).body["apis"]
    listed = {v["api_key"]: (v["min_version"], v["max_version"]) for v in versions}
    assert listed[ApiKey.PRODUCE] == (0, apis.INTERNAL_VERSION) and listed[ApiKey.CREATE_TOPIC] == (0, 1)
    assert ApiKey.ALLOCATE_IDS not in listed


def test_an_unreadable_group_record_costs_that_record_not_the_node(fresh_cluster: LocalCluster,
                                                                     topic_name: str) -> None:
    """A record no coordinator can read, written the nodes' way (PRODUCE version 1, what a
    buggy or hostile peer could still do), then the partition's leader restarted: the next
    leader loads the partition past it, and the group's commits survive."""
    bootstrap = fresh_cluster.bootstrap
    group = f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    _commit(bootstrap, group, topic_name, 7)
    partition = group_format.coordinator_partition(group)
    keys = [b"o\xff\xfe garbage", group_format.OFFSET_KEY_PREFIX + f"{group}\0{topic_name}\0notint".encode(),
            group_format.GROUP_KEY_PREFIX + b"\xff", group_format.GROUP_KEY_PREFIX + group.encode()]
    bad = batch.encode_batch([1] * len(keys), keys, [b"\x00\x01garbage"] * len(keys))
    body = {"acks": -1, "timeout_ms": 10_000, "entries": [{"topic": group_format.OFFSETS_TOPIC, "partition": partition}]}
    frames = apis.encode_request(ApiKey.PRODUCE, body, 5, api_version=apis.INTERNAL_VERSION, batches=[bad])
    answer = decode(raw_request(leader_address(bootstrap, group_format.OFFSETS_TOPIC, partition), frames))
    assert answer.body["results"][0]["error"] == 0  # written: the nodes' version may

    coordinator = leader_id(bootstrap, group_format.OFFSETS_TOPIC, partition)
    fresh_cluster.stop_node(coordinator)
    deadline = time.monotonic() + 60
    while leader_id(bootstrap, group_format.OFFSETS_TOPIC, partition) in (coordinator, -1):
        assert time.monotonic() < deadline, "no new leader for the group's partition"
        time.sleep(0.2)
    fresh_cluster.start_node(coordinator)
    assert _committed(bootstrap, group, topic_name) == 7  # the new coordinator loaded past the garbage
    _commit(bootstrap, group, topic_name, 8)
    assert _committed(bootstrap, group, topic_name) == 8
    time.sleep(1.0)  # a node that stopped while loading would be gone by now
    assert all(node.process.running for node in fresh_cluster.nodes.values())


def test_internal_topics_made_on_one_node_get_three_copies_as_nodes_join(zk_server: LocalZooKeeper,
                                                                         tmp_path: Path, topic_name: str) -> None:
    """A first group commit and a first queue receive on a one-node cluster make the
    internal topics with one replica each (min_insync 1); once two more nodes join, the
    controller moves every partition of both to three replicas, all in sync, raises their
    min_insync to 2 (it stayed 1: acks=all commits acknowledged by one copy), and the
    committed offset is still there when the first node is gone."""
    cluster = make_cluster(zk_server, tmp_path / "cluster", nodes=1)
    cluster.start()
    try:
        bootstrap = cluster.bootstrap
        with Admin(bootstrap) as admin:
            admin.create_topic(topic_name, partitions=1, replication_factor=1)
            admin.create_queue(f"{topic_name}-q", replication_factor=1)
        _commit(bootstrap, "g", topic_name, 7)
        with QueueConsumer(bootstrap, f"{topic_name}-q") as worker:
            worker.receive(1, 0)
        with Admin(bootstrap) as admin:
            for internal in (group_format.OFFSETS_TOPIC, qp.STATE_TOPIC):
                assert {len(p.replicas) for p in admin.describe_topic(internal).partitions} == {1}
                assert admin.describe_topic(internal).configs["min_insync"] == "1"
        cluster.add_node(2)
        cluster.add_node(3)
        with Admin(bootstrap) as admin:  # a user's topic grown by hand keeps what its user set
            admin.reassign_partition(topic_name, 0, [1, 2, 3])

        def grown() -> bool:
            with Admin(bootstrap) as admin:
                return all(len(p.replicas) == 3 and len(p.isr) == 3
                           for internal in (group_format.OFFSETS_TOPIC, qp.STATE_TOPIC)
                           for p in admin.describe_topic(internal).partitions)

        deadline = time.monotonic() + 90
        while not grown() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert grown(), "the internal topics were not given three replicas"

        def configs() -> list[tuple[str, str]]:
            with Admin(bootstrap) as admin:
                return [(c["replication_factor"], c["min_insync"])
                        for c in (admin.describe_topic(t).configs for t in (group_format.OFFSETS_TOPIC, qp.STATE_TOPIC))]

        deadline = time.monotonic() + 10
        while configs() != [("3", "2")] * 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert configs() == [("3", "2")] * 2, "the grown internal topics kept their creation's min_insync"
        with Admin(bootstrap) as admin:
            admin.wait_reassigned(topic_name, 0, [1, 2, 3], timeout_s=30)
            assert admin.describe_topic(topic_name).configs["min_insync"] == "1"
            # What it has now, 3 copies, is what alter and create_partitions go by: made with 1,
            # it refused min_insync 2 and got new partitions of 1 copy.
            admin.alter_topic_config(topic_name, {"min_insync": 2})
            deadline = time.monotonic() + 10  # the node answering describe learns it by its watch
            while (now := admin.describe_topic(topic_name).configs)["min_insync"] != "2" and time.monotonic() < deadline:
                time.sleep(0.1)
            assert (now["replication_factor"], now["min_insync"]) == ("3", "2")
            admin.create_partitions(topic_name, 2)
            assert sorted(len(p.replicas) for p in admin.describe_topic(topic_name).partitions) == [3, 3]
        cluster.nodes[1].kill()
        deadline = time.monotonic() + 60
        committed = None
        while committed != 7 and time.monotonic() < deadline:
            try:
                committed = _committed(bootstrap, "g", topic_name)
            except errors.FabricError:
                time.sleep(0.5)
        assert committed == 7
    finally:
        cluster.stop()

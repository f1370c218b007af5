"""A topic deleted and created again while one of its replicas is paused (found by an
audit of the durability promises): the paused node woke up still holding, and leading,
the old incarnation. It served the old records to the new topic's replicas, which then
counted as caught up for the new topic's acks=all writes; after a failover consumers read
the old records at offsets where acknowledged new ones had been.

Now the new incarnation's leader epochs differ from the old one's (fabric/zk.py
``initial_leader_epoch``), which fences the woken node's old role, and the node wipes a
copy whose incarnation is not the topic's (nodes/roles.py ``apply_roles``)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from fabric import errors
from fabric.local import LocalZooKeeper
from fabric.protocol.apis import ApiKey
from sdk import Admin, Consumer, Producer, TopicPartition
from tests.conftest import make_cluster
from tests.fault.harness import keep_logs

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 2_000
PARTITIONS = 4
OLD_RECORDS = 4_000
NEW_RECORDS = 200


def test_a_replica_paused_through_delete_and_create_serves_nothing_old(zk_server: LocalZooKeeper, tmp_path: Path,
                                                                       seed: int) -> None:
    rng = random.Random(seed)
    cluster = make_cluster(zk_server, tmp_path / "cluster", nodes=4, session_timeout_ms=SESSION_TIMEOUT_MS,
                           node_args=["--replica-lag-max-ms", "1500"])
    cluster.start()
    victim = rng.choice(sorted(cluster.nodes))
    topic = "reborn"
    try:
        admin = Admin(cluster.bootstrap)
        admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(OLD_RECORDS):
                producer.send(topic, b"old-%d" % i, partition=i % PARTITIONS)
            producer.flush(60)
        time.sleep(1.0)
        # Delete and create through another node: the Admin asks the nodes in the map's order,
        # and one request to the paused victim waits out the request timeout (30 s), far past
        # its session. The victim then woke with its session lost and wiped its copy on
        # registering again: the old incarnation it should wake up holding was gone (seed 404).
        via = next(address for node_id, address in admin.nodes().items() if node_id != victim)
        cluster.nodes[victim].pause()
        paused_at = time.monotonic()
        try:
            call_via(admin, via, ApiKey.DELETE_TOPIC, {"name": topic})
            call_via(admin, via, ApiKey.CREATE_TOPIC, {"name": topic, "partitions": PARTITIONS, "replication_factor": 3,
                                                       "configs": []})
            time.sleep(0.5)
        finally:
            cluster.nodes[victim].resume()
        print(f"node {victim} paused {time.monotonic() - paused_at:.1f} s through the delete and create "
              f"(session timeout {SESSION_TIMEOUT_MS / 1000:g} s)")
        admin.wait_for_topic(topic, PARTITIONS)
        acked: dict[tuple[int, int], bytes] = {}
        with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=60_000) as producer:
            futures = [(b"new-%d" % i, producer.send(topic, b"new-%d" % i, partition=i % PARTITIONS))
                       for i in range(NEW_RECORDS)]
            producer.flush(60)
            for value, future in futures:
                meta = future.result(0)
                acked[(meta.partition, meta.offset)] = value
        time.sleep(3.0)
        # An ordinary failover: the victim stops past its session, leaderships move.
        cluster.nodes[victim].pause()
        try:
            time.sleep(SESSION_TIMEOUT_MS / 1000 * 3)
            seen: dict[tuple[int, int], bytes] = {}
            with Consumer(cluster.bootstrap) as consumer:
                tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
                consumer.assign(tps)
                consumer.seek_to_beginning()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not set(acked) <= set(seen):
                    for record in consumer.poll(timeout_ms=500):
                        seen[(record.partition, record.offset)] = record.value
            described = call_via(admin, via, ApiKey.DESCRIBE_TOPICS, {"names": [topic]})["topics"][0]
            states = {p["partition"]: (p["leader"], p["leader_epoch"], p["isr"]) for p in described["partitions"]}
        finally:
            cluster.nodes[victim].resume()
        print("partitions", states, "seen per partition",
              {p: sum(1 for k in seen if k[0] == p) for p in range(PARTITIONS)},
              "acked per partition", {p: sum(1 for k in acked if k[0] == p) for p in range(PARTITIONS)})
        old = sorted(k for k, v in seen.items() if v.startswith(b"old-"))
        lost = sorted(k for k, v in acked.items() if seen.get(k) != v)
        assert not old, f"old-incarnation records served at {old[:5]} (victim node {victim})"
        assert not lost, f"acknowledged records lost or replaced at {lost[:5]} (victim node {victim})"
    finally:
        cluster.stop()
        keep_logs(cluster, "test_a_replica_paused_through_delete_and_create_serves_nothing_old")


def call_via(admin: Admin, address: str, api: ApiKey, body: dict[str, Any]) -> dict[str, Any]:
    """One admin request to the node at ``address``, not to the first node of the Admin's
    map, which may be the paused victim."""
    reply = admin._conns.request(address, api, body).body
    errors.raise_for_code(reply.get("error", 0), reply.get("message", ""))
    return reply

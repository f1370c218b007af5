"""ALTER_TOPIC_CONFIGS (Admin.alter_topic_config, ``fabric topic alter``): some of a topic's
configs changed after creation, the rest kept, and the nodes acting on the new values."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fabric import errors
from fabric.local import LocalCluster, LocalZooKeeper
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from sdk import Admin, Consumer, Producer, TopicPartition
from tests.conftest import make_cluster
from tests.fault.harness import wait_until
from tests.integration.helpers import decode, raw_request


def test_a_shorter_retention_deletes_what_it_no_longer_keeps(zk_server: LocalZooKeeper, tmp_path: Path,
                                                             topic_name: str) -> None:
    cluster = make_cluster(zk_server, tmp_path / "c", nodes=1, node_args=["--retention-check-interval-ms", "100"])
    with cluster, Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=1)  # 7 days
        with Producer(cluster.bootstrap, linger_ms=0) as producer:
            for i in range(10):
                producer.send(topic_name, b"old %d" % i).result(10)
        tp = TopicPartition(topic_name, 0)
        with Consumer(cluster.bootstrap) as consumer:
            time.sleep(1.0)  # ten retention checks
            assert consumer.beginning_offsets([tp])[tp] == 0
            admin.alter_topic_config(topic_name, {"retention_ms": 300})
            wait_until(lambda: consumer.beginning_offsets([tp])[tp] >= 10, "retention to delete the old batches", 30)
            assert consumer.beginning_offsets([tp])[tp] == 10
            assert consumer.end_offsets([tp])[tp] == 10
        configs = admin.describe_topic(topic_name).configs
        assert (configs["retention_ms"], configs["retention_bytes"], configs["partitions"]) == ("300", "-1", "1")


def test_alterable_keys_change_and_the_others_are_refused(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, config={"retention_bytes": 1_000_000})
        created = admin.describe_topic(topic_name).configs
        admin.alter_topic_config(topic_name, {"min_insync": 3, "unclean_leader_election": True})
        wait_until(lambda: admin.describe_topic(topic_name).configs["min_insync"] == "3", "the new configs", 10)
        after = admin.describe_topic(topic_name).configs
        assert (after["min_insync"], after["unclean_leader_election"]) == ("3", "true")
        assert {k: v for k, v in after.items() if k not in ("min_insync", "unclean_leader_election")} == \
            {k: v for k, v in created.items() if k not in ("min_insync", "unclean_leader_election")}
        refusals = [
            ({"strict_order": True}, "fixed at creation"),
            ({"queue": True}, "fixed at creation"),
            ({"dead_letter": "x"}, "fixed at creation"),
            ({"partitions": 5}, "fabric topic add-partitions"),  # shown by describe: say what changes it
            ({"replication_factor": 2}, "fabric topic reassign"),
            ({"frob": 1}, "not a topic config"),
            ({"min_insync": 4}, "replication_factor=3"),
            ({"retention_ms": 0}, "retention_ms"),
            ({"message_bytes_max": 10}, "message_bytes_max"),
            ({"retention_ms": "1_000"}, "decimal integer"),
        ]
        for config, why in refusals:
            with pytest.raises(errors.InvalidConfigError, match=why):
                admin.alter_topic_config(topic_name, config)
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.alter_topic_config(topic_name + "-missing", {"retention_ms": 1000})
        with pytest.raises(errors.InvalidTopicError, match="internal"):
            admin.alter_topic_config("__consumer_offsets", {"retention_ms": 1000})
        with pytest.raises(TypeError):
            admin.alter_topic_config(topic_name, {})
        assert admin.describe_topic(topic_name).configs == after  # nothing refused changed anything


def test_a_lowered_message_bytes_max_reaches_a_running_idempotent_producer(cluster: LocalCluster,
                                                                            topic_name: str) -> None:
    """message_bytes_max lowered under a producer with batches in flight: the ones now too
    large are refused (MESSAGE_TOO_LARGE), the refusal makes the producer ask for metadata
    again, and its later batches fit. The refused batches give their sequence numbers back:
    before, every later batch of the partition was refused as OUT_OF_ORDER_SEQUENCE for good.
    Every record acknowledged is stored once, in send order."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
        with Producer(cluster.bootstrap, linger_ms=0, compression="none", batch_bytes_max=16_384) as producer:
            producer.send(topic_name, b"first").result(10)
            sent: list[tuple[bytes, Any]] = []
            for i in range(3_000):
                value = b"%06d" % i + os.urandom(94)
                sent.append((value, producer.send(topic_name, value)))
                if i == 500:
                    admin.alter_topic_config(topic_name, {"message_bytes_max": 4096})
            producer.flush(60)
            late = [(value, producer.send(topic_name, value)) for value in (b"late-%04d" % i for i in range(500))]
            producer.flush(60)
    outcomes = [(value, future.exception(0)) for value, future in sent + late]
    assert {type(exc) for _, exc in outcomes if exc is not None} <= {errors.MessageTooLargeError}
    assert all(exc is None for _, exc in outcomes[-500:])  # the producer works again
    acknowledged = [value for value, exc in outcomes if exc is None]
    with Consumer(cluster.bootstrap) as consumer:
        tp = TopicPartition(topic_name, 0)
        consumer.assign([tp])
        consumer.seek(tp, 1)
        stored: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(stored) < len(acknowledged) and time.monotonic() < deadline:
            stored.extend(r.value for r in consumer.poll(timeout_ms=500))
        assert consumer.end_offsets([tp])[tp] == 1 + len(acknowledged)
    assert stored == acknowledged  # each once, in send order


def test_cli_topic_alter(cluster: LocalCluster, topic_name: str, tmp_path: Path) -> None:
    env = {**os.environ, "FABRIC_BOOTSTRAP": cluster.bootstrap, "FABRIC_HOME": str(tmp_path)}

    def fabric(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fabric.cli", *args], env=env, capture_output=True, text=True,
                              timeout=120, check=False)

    assert fabric("topic", "create", topic_name).returncode == 0
    done = fabric("topic", "alter", topic_name, "-c", "retention_ms=86400000", "-c", "retention_bytes=1000000")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"topic {topic_name}: retention_ms=86400000, retention_bytes=1000000"
    wait_until(lambda: "retention_ms = 86400000" in fabric("topic", "describe", topic_name).stdout,
               "describe to show the new retention", 10, interval_s=0.2)
    refused = fabric("topic", "alter", topic_name, "-c", "strict_order=true")
    assert refused.returncode == 1 and "fixed at creation" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    usage = fabric("topic", "alter", topic_name)
    assert usage.returncode == 2 and "--config" in usage.stderr


def test_a_config_key_given_twice_is_refused_and_changes_nothing(cluster: LocalCluster, topic_name: str) -> None:
    """CREATE_TOPIC and ALTER_TOPIC_CONFIGS with one key twice (a raw client can send that;
    the SDK's dict cannot): INVALID_CONFIG naming the key, not one value silently winning."""
    twice = [{"key": "retention_ms", "value": "1000"}, {"key": "retention_ms", "value": "2000"}]
    create = apis.encode_request(ApiKey.CREATE_TOPIC, {"name": topic_name, "partitions": 1, "replication_factor": 1,
                                                       "configs": twice}, 1)
    with Admin(cluster.bootstrap) as admin:
        address = next(iter(admin.nodes().values()))
        body = decode(raw_request(address, create)).body
        assert body["error"] == errors.InvalidConfigError.code and "'retention_ms' is given more than once" in body["message"]
        assert topic_name not in admin.list_topics()
        admin.create_topic(topic_name, partitions=1, replication_factor=1, config={"retention_ms": 5000})
        alter = apis.encode_request(ApiKey.ALTER_TOPIC_CONFIGS, {"name": topic_name, "configs": twice}, 2)
        body = decode(raw_request(address, alter)).body
        assert body["error"] == errors.InvalidConfigError.code and "more than once" in body["message"]
        assert admin.describe_topic(topic_name).configs["retention_ms"] == "5000"

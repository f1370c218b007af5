"""``__consumer_offsets`` is compacted (nodes/group_records.py): the coordinator restates its
groups' live records and deletes the log below them, on every replica, and a new
coordinator loads the same offsets, memberships and deletions from what is left."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fabric import errors
from fabric.cli import main
from fabric.local import LocalCluster
from fabric.protocol import groups as gp
from nodes.group_records import RESTATE_AFTER_RECORDS_MIN
from sdk import Admin, Producer

PARTITIONS = 100  # one OFFSET_COMMIT of the topic writes this many records


def _replicas(admin: Admin, partition: int) -> list[dict[str, Any]]:
    return admin.describe_replicas([gp.OFFSETS_TOPIC]).get((gp.OFFSETS_TOPIC, partition), [])


@pytest.mark.slow
def test_offsets_log_is_compacted_and_a_new_coordinator_loads_the_same_groups(
        fresh_cluster: LocalCluster, topic_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = fresh_cluster.bootstrap
    group = f"g-{topic_name}"
    partition = gp.coordinator_partition(group)
    # A group in the same partition that is deleted before the compaction: it must stay
    # deleted once its records (and their tombstones) are gone from the log.
    gone = next(g for i in range(1000) if gp.coordinator_partition(g := f"gone-{i}-{topic_name}") == partition)
    rounds = RESTATE_AFTER_RECORDS_MIN // PARTITIONS + 20
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=3)
        with Producer(bootstrap, linger_ms=5) as producer:  # reset_offsets keeps to the log's range
            for p in range(PARTITIONS):
                producer.send_batch(topic_name, [b"x"] * (rounds + 1), partition=p)
        admin.reset_offsets(gone, topic_name, to="offset", offset=5)
        admin.delete_group(gone)
        for i in range(rounds):
            admin.reset_offsets(group, topic_name, to="offset", offset=i)
        last = rounds - 1
        assert [p.committed for p in admin.describe_group(group).offsets] == [last] * PARTITIONS

        written = rounds * PARTITIONS
        deadline = time.monotonic() + 60
        while True:
            rows = _replicas(admin, partition)
            if len(rows) == 3 and all(r["log_start_offset"] > written // 2 for r in rows):
                break
            assert time.monotonic() < deadline, f"not compacted on every replica: {rows}"
            time.sleep(0.5)
        leader_row = next(r for r in rows if r["role"] == "leader")
        assert leader_row["log_end_offset"] - leader_row["log_start_offset"] < written // 2
        capsys.readouterr()
        assert main(["topic", "describe", gp.OFFSETS_TOPIC, "-b", bootstrap]) == 0  # as GROUPS.md shows it
        assert f"{leader_row['log_start_offset']}..{leader_row['log_end_offset']}" in capsys.readouterr().out

        coordinator = admin._find_coordinator(group)
        node_id = next(n for n, address in admin.nodes().items() if address == coordinator)
    fresh_cluster.nodes[node_id].kill()
    deadline = time.monotonic() + 60
    while True:  # a new coordinator, loaded from the compacted log
        try:
            with Admin(bootstrap, request_timeout_ms=5_000) as admin:
                if admin._find_coordinator(group) != coordinator:
                    offsets = [p.committed for p in admin.describe_group(group).offsets]
                    break
        except errors.FabricError:
            pass
        assert time.monotonic() < deadline, "no new coordinator"
        time.sleep(0.5)
    assert offsets == [last] * PARTITIONS
    with Admin(bootstrap, request_timeout_ms=5_000) as admin:
        with pytest.raises(errors.GroupIdNotFoundError):
            admin.describe_group(gone)
        assert group in {g.group_id for g in admin.list_groups()}
        assert gone not in {g.group_id for g in admin.list_groups()}
        admin.reset_offsets(group, topic_name, to="offset", offset=last + 1)  # and it still takes writes
        assert [p.committed for p in admin.describe_group(group).offsets] == [last + 1] * PARTITIONS

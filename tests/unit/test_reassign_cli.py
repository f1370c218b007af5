"""``fabric topic reassign``'s plan file and ``fabric topic describe``'s log line, as pure functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric.cli._common import CliError
from fabric.cli.reassign import generate_plan, log_line, read_plan, too_few_nodes
from sdk._client import PartitionMetadata
from sdk.admin import TopicDescription


def test_read_plan_accepts_kafkas_shape(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"partitions": [{"topic": "a", "partition": 0, "replicas": [1, 2, 4]},
                                               {"topic": "b", "partition": 3, "replicas": [4]}]}))
    assert read_plan(str(plan)) == [("a", 0, [1, 2, 4]), ("b", 3, [4])]


@pytest.mark.parametrize("content", [
    "not json", "[]", '{"partitions": []}', '{"partitions": [{"topic": "a", "partition": -1, "replicas": [1]}]}',
    '{"partitions": [{"topic": "a", "partition": 0, "replicas": []}]}',
    '{"partitions": [{"topic": "a", "partition": 0, "replicas": [true]}]}',
    '{"partitions": [{"topic": 5, "partition": 0, "replicas": [1]}]}',
])
def test_read_plan_refuses_malformed_plans(tmp_path: Path, content: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(content)
    with pytest.raises(CliError):
        read_plan(str(plan))
    with pytest.raises(CliError, match="cannot read plan"):
        read_plan(str(tmp_path / "missing.json"))


def row(node_id: int, role: str, start: int, end: int, hw: int, size: int, adding: list[int] | None = None,
        removing: list[int] | None = None, throttle: int = 0) -> dict[str, object]:
    return {"node_id": node_id, "role": role, "log_start_offset": start, "log_end_offset": end, "high_watermark": hw,
            "size_bytes": size, "adding": adding or [], "removing": removing or [], "throttle_bytes_per_s": throttle}


def test_log_line_at_rest_and_while_moving() -> None:
    assert log_line([]) == "log ? (no leader answered)"
    assert log_line([row(1, "leader", 10, 110, 100, 2048), row(2, "follower", 10, 100, 100, 2000)]) == \
        "log 10..100 (90 records, 2.0 KiB)"
    moving = log_line([row(1, "leader", 0, 200, 200, 500, adding=[4], removing=[1], throttle=1024 * 1024),
                       row(4, "follower", 0, 50, 50, 100)])
    assert "reassigning: adding [4] removing [1], throttle 1.0 MiB/s: node 4 at 50/200 (25%)" in moving


def topic(name: str, *replicas: tuple[int, ...]) -> TopicDescription:
    return TopicDescription(name, {}, tuple(PartitionMetadata(i, r[0], 0, r, r) for i, r in enumerate(replicas)))


def test_generate_needs_as_many_nodes_as_replicas() -> None:
    """`--generate 1` for a topic of 3 replicas said "replication_factor=3 but only 1 live
    nodes", with three nodes live: the list was too short, not the cluster."""
    orders = topic("orders", (1, 2, 3), (2, 3, 1))
    assert too_few_nodes([orders], [1], {}) == ("topic orders keeps 3 replicas of each partition, one per node, "
                                                "so a plan for it needs at least 3 nodes; 1 given")
    assert too_few_nodes([orders, topic("solo", (1,))], [4, 5, 6], {}) is None
    assert too_few_nodes([], [1], {}) is None


def test_a_moving_partition_counts_as_its_target() -> None:
    """While a move runs the replicas are the old and the new ones together: [1, 2, 3, 4]
    moving to [2, 3, 4] counted 4 replicas (a plan one too many, or "replication_factor=4")."""
    moving = topic("orders", (1, 2, 3, 4))
    copies = {("orders", 0): [row(1, "leader", 0, 10, 10, 100, adding=[4], removing=[1])]}
    assert too_few_nodes([moving], [2, 3, 4], copies) is None
    assert too_few_nodes([moving], [2, 3, 4], {}) is not None
    plan = generate_plan([moving], [5, 6, 7], copies)
    assert [len(move["replicas"]) for move in plan["partitions"]] == [3]

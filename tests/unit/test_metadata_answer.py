"""The METADATA answer (nodes/admin.py) built from a node's routing map."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fabric.protocol import apis
from fabric.zk import NodeInfo, PartitionState, TopicConfig, TopicRoute
from nodes.admin import handle_metadata


class _Routing:
    def __init__(self, topics: dict[str, TopicRoute], nodes: dict[int, NodeInfo]) -> None:
        self._topics, self._nodes, self.controller_id = topics, nodes, 1

    def topics(self) -> dict[str, TopicRoute]:
        return self._topics

    def nodes(self) -> dict[int, NodeInfo]:
        return self._nodes


def _answer(leaders: list[int], live: list[int]) -> dict[str, Any]:
    states = {p: PartitionState(p, (1, 2, 3), leader, 7, (1, 2, 3)) for p, leader in enumerate(leaders)}
    route = TopicRoute("t", TopicConfig(partitions=len(leaders)), states)
    routing = _Routing({"t": route}, {n: NodeInfo(n, f"tcp://127.0.0.1:{9000 + n}") for n in live})
    node = SimpleNamespace(routing=routing, check_routing_current=lambda: None)
    request = apis.Message(None, {"topics": ["t"]}, [])  # type: ignore[arg-type]
    return handle_metadata(node, None, request)  # type: ignore[arg-type]


def test_a_leader_missing_from_the_node_list_is_answered_as_none() -> None:
    """Between a leader's session expiring and the controller's election, the routing map
    still names the dead node as leader while the node list no longer has it: the answer
    said leader 2 with no node 2 to send to, and a QueueConsumer polled nobody for good."""
    body = _answer(leaders=[1, 2, -1], live=[1, 3])
    assert [n["node_id"] for n in body["nodes"]] == [1, 3]
    partitions = body["topics"][0]["partitions"]
    assert [p["leader"] for p in partitions] == [1, -1, -1]
    assert all(p["error"] == 0 and p["leader_epoch"] == 7 for p in partitions)


def test_every_leader_answered_is_a_listed_node() -> None:
    body = _answer(leaders=[1, 2, 3], live=[1, 2, 3])
    assert [p["leader"] for p in body["topics"][0]["partitions"]] == [1, 2, 3]

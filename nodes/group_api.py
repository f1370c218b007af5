"""How the node's loop reaches its consumer-group coordinator (``nodes/group_coordinator.py``):
the handler of the group APIs and the duty that runs before each turn's requests."""

from __future__ import annotations

from fabric import errors
from fabric.protocol import apis
from nodes.group_coordinator import GROUP_APIS
from nodes.state import Envelope, NodeState

__all__ = ["GROUP_APIS", "handle", "tick"]


def handle(node: NodeState, envelope: Envelope, request: apis.Message) -> None:
    """The coordinator answers now, or once the writes it depends on commit."""
    if node.groups is None:
        raise errors.NodeNotReadyError(f"node {node.node_id} has no group coordinator yet")
    node.groups.handle(envelope, request)


def tick(node: NodeState, _now: float) -> None:
    if node.groups is not None:
        node.groups.tick()  # it must know what it coordinates now, before requests

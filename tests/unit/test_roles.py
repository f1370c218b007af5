"""The partition role state machine (nodes/roles.py), fed roles and events: no sockets."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fabric.zk import PartitionState, TopicConfig, TopicRoute
from nodes.roles import (
    DROP,
    ELECTED,
    FOLLOW,
    FOLLOWER,
    KEEP,
    LEAD,
    LEADER,
    LEADER_ELSEWHERE,
    NONE,
    OFFLINE,
    STEP_DOWN,
    UNHOSTED,
    Event,
    ImpossibleTransitionError,
    Role,
    apply_roles,
    event_for,
    transition,
)

ME = 1


def state(leader: int, epoch: int, replicas: tuple[int, ...] = (1, 2, 3)) -> PartitionState:
    return PartitionState(0, replicas, leader, epoch, replicas, version=3)


def test_events_from_zookeeper_state() -> None:
    assert event_for(state(ME, 4), ME) == Event(ELECTED, ME, 4)
    assert event_for(state(2, 4), ME) == Event(LEADER_ELSEWHERE, 2, 4)
    assert event_for(state(-1, 5), ME) == Event(OFFLINE)
    assert event_for(state(2, 4, replicas=(2, 3)), ME) == Event(UNHOSTED)


@pytest.mark.parametrize(
    ("current", "event", "expected_role", "expected_action"),
    [
        # Elected: lead, unless already leading in this very epoch.
        (Role(), Event(ELECTED, ME, 4), Role(LEADER, ME, 4), LEAD),
        (Role(FOLLOWER, 2, 3), Event(ELECTED, ME, 4), Role(LEADER, ME, 4), LEAD),
        (Role(LEADER, ME, 4), Event(ELECTED, ME, 4), Role(LEADER, ME, 4), KEEP),
        (Role(LEADER, ME, 4), Event(ELECTED, ME, 6), Role(LEADER, ME, 6), LEAD),
        # Another leader: follow it afresh (truncation first), unless already following it.
        (Role(), Event(LEADER_ELSEWHERE, 2, 4), Role(FOLLOWER, 2, 4), FOLLOW),
        (Role(LEADER, ME, 4), Event(LEADER_ELSEWHERE, 2, 5), Role(FOLLOWER, 2, 5), FOLLOW),
        (Role(FOLLOWER, 2, 4), Event(LEADER_ELSEWHERE, 2, 4), Role(FOLLOWER, 2, 4), KEEP),
        (Role(FOLLOWER, 2, 4), Event(LEADER_ELSEWHERE, 2, 5), Role(FOLLOWER, 2, 5), FOLLOW),
        (Role(FOLLOWER, 2, 4), Event(LEADER_ELSEWHERE, 3, 5), Role(FOLLOWER, 3, 5), FOLLOW),
        # No leader or not hosted here any more: drop whatever role there was.
        (Role(LEADER, ME, 4), Event(OFFLINE), Role(), DROP),
        (Role(FOLLOWER, 2, 4), Event(UNHOSTED), Role(), DROP),
        (Role(), Event(OFFLINE), Role(), KEEP),
        (Role(), Event(UNHOSTED), Role(), KEEP),
        # A doubtful session ends a leadership.
        (Role(LEADER, ME, 4), Event(STEP_DOWN), Role(), DROP),
    ],
)
def test_transitions(current: Role, event: Event, expected_role: Role, expected_action: str) -> None:
    assert transition(current, event) == (expected_role, expected_action)


@pytest.mark.parametrize(
    ("current", "event"),
    [
        (Role(FOLLOWER, 2, 4), Event(STEP_DOWN)),  # only leaderships are stepped down
        (Role(), Event(STEP_DOWN)),
        (Role(), Event(LEADER_ELSEWHERE, -1, 4)),  # "no leader" is OFFLINE, not a leader to follow
        (Role(), Event("bogus")),
        (Role("observer"), Event(OFFLINE)),
    ],
)
def test_impossible_transitions_raise(current: Role, event: Event) -> None:
    with pytest.raises(ImpossibleTransitionError):
        transition(current, event)


def test_every_role_answers_every_zookeeper_event() -> None:
    # Whatever ZooKeeper says, each role has exactly one answer (no gap in the table).
    for role in (Role(), Role(LEADER, ME, 4), Role(FOLLOWER, 2, 4)):
        for zk_state in (state(ME, 4), state(ME, 5), state(2, 4), state(3, 5), state(-1, 5)):
            new_role, action = transition(role, event_for(zk_state, ME))
            assert action in (KEEP, LEAD, FOLLOW, DROP)
            assert new_role.name in (LEADER, FOLLOWER, NONE)


class _Routing:
    """The two reads apply_roles makes of the routing map (fabric.zk.RoutingCache)."""

    def __init__(self, topics: dict[str, TopicRoute]) -> None:
        self._topics = topics

    def topics(self) -> dict[str, TopicRoute]:
        return self._topics

    def nodes(self) -> dict[int, Any]:
        return {}


def test_topics_created_and_deleted_leave_no_config_behind() -> None:
    """A node kept the TopicConfig of every topic it ever saw: a loop creating and deleting
    topics grew ``node.configs`` by one entry per topic, for ever."""
    node = SimpleNamespace(routing_dirty=True, configs={}, logs={}, states={}, pkeys={}, known_topics=set(),
                           node_id=ME, sub_connected=set(), sub_disconnect_pending=set())
    kept = TopicRoute("kept", TopicConfig(partitions=1))
    for n in range(50):
        created = TopicRoute(f"churn-{n}", TopicConfig(partitions=1))
        node.routing = _Routing({"kept": kept, created.name: created})
        apply_roles(node)  # type: ignore[arg-type]
        assert set(node.configs) == {"kept", created.name}
        node.routing = _Routing({"kept": kept})  # deleted
        apply_roles(node)  # type: ignore[arg-type]
        assert set(node.configs) == {"kept"}

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
    """The reads apply_roles makes of the routing map (fabric.zk.RoutingCache); ``changed``:
    what ``take_changes`` reports once (None: everything)."""

    def __init__(self, topics: dict[str, TopicRoute], changed: set[tuple[str, int]] | None = None) -> None:
        self._topics = topics
        self.changed = changed
        self.whole_reads = 0

    def topics(self) -> dict[str, TopicRoute]:
        self.whole_reads += 1
        return self._topics

    def nodes(self) -> dict[int, Any]:
        return {}

    def take_changes(self) -> set[tuple[str, int]] | None:
        changed, self.changed = self.changed, None
        return changed

    def partition(self, name: str, partition: int) -> tuple[TopicConfig, PartitionState] | None:
        route = self._topics.get(name)
        state = None if route is None else route.partitions.get(partition)
        return None if route is None or state is None else (route.config, state)


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


def _node_following(routes: dict[str, TopicRoute], leader: int, epoch: int) -> SimpleNamespace:
    """A node that follows every partition of ``routes`` (leader ``leader`` at ``epoch``)."""
    from nodes.follower import FollowerReplica

    config = next(iter(routes.values())).config
    tps = [(name, p) for name, route in routes.items() for p in route.partitions]
    return SimpleNamespace(
        routing_dirty=True, configs={name: route.config for name, route in routes.items()}, node_id=ME,
        logs={tp: SimpleNamespace(incarnation=config.created_ms) for tp in tps},
        states={tp: routes[tp[0]].partitions[tp[1]] for tp in tps}, pkeys={}, known_topics=set(routes),
        leaders={}, followers={tp: FollowerReplica(leader, epoch) for tp in tps}, replica_requests={},
        subscribed=set(), sockets=SimpleNamespace(sub=SimpleNamespace(setsockopt=lambda *_args: None)),
        sub_connected=set(), sub_disconnect_pending=set())


def test_a_changed_partition_is_applied_alone_not_the_whole_map() -> None:
    """Each partition event made the node walk every partition of the map again: at 2,000
    partitions, a failover's 667 events cost a restarting node 30-40 % of its time."""
    config = TopicConfig(partitions=100, created_ms=7)
    before = {p: PartitionState(p, (1, 2, 3), 2, 4, (1, 2, 3), version=3) for p in range(100)}
    route = TopicRoute("t", config, dict(before))
    node = _node_following({"t": route}, leader=2, epoch=4)
    route.partitions[5] = PartitionState(5, (1, 2, 3), 3, 5, (1, 3), version=4)  # node 2 failed: 3 leads
    node.routing = _Routing({"t": route}, changed={("t", 5)})
    apply_roles(node)  # type: ignore[arg-type]
    assert node.routing.whole_reads == 0
    assert (node.followers[("t", 5)].leader_id, node.followers[("t", 5)].epoch) == (3, 5)
    assert node.states[("t", 5)].version == 4
    assert all(node.followers[("t", p)].leader_id == 2 for p in range(100) if p != 5)


def test_a_changed_partition_no_longer_hosted_here_takes_the_whole_pass() -> None:
    config = TopicConfig(partitions=2, created_ms=7)
    route = TopicRoute("t", config, {p: PartitionState(p, (1, 2, 3), 2, 4, (1, 2, 3), version=3) for p in range(2)})
    node = _node_following({"t": route}, leader=2, epoch=4)
    node.logs[("t", 1)] = SimpleNamespace(incarnation=7, wipe=lambda: None)
    route.partitions[1] = PartitionState(1, (2, 3, 4), 2, 4, (2, 3, 4), version=4)  # moved away from us
    node.routing = _Routing({"t": route}, changed={("t", 1)})
    apply_roles(node)  # type: ignore[arg-type]
    assert node.routing.whole_reads == 1
    assert ("t", 1) not in node.followers and ("t", 1) not in node.logs  # its copy wiped


def test_the_routing_cache_reports_which_partitions_changed_or_that_everything_may_have() -> None:
    from fabric.zk import RoutingCache

    def answer(state: PartitionState, version: int) -> Any:
        """A read's answer, as kazoo hands it to ``_partition_read``."""
        return SimpleNamespace(successful=lambda: True, value=(state.encode(), SimpleNamespace(version=version)))

    cache = RoutingCache(None)  # no ZooKeeper: the answers to its reads are fed by hand
    assert cache.take_changes() is None  # nothing applied yet: the whole map
    cache._topics["t"] = TopicRoute("t", TopicConfig(partitions=3), {})
    cache._partition_read("t", 1, answer(PartitionState(1, (1, 2, 3), 2, 5, (2, 3)), 4))
    cache.apply_partition_state("t", PartitionState(2, (1, 2, 3), 1, 5, (1, 2), version=6))
    assert cache.take_changes() == {("t", 1), ("t", 2)}
    assert cache.take_changes() is None  # nothing recorded since: the caller was told something else
    cache._partition_read("t", 1, answer(PartitionState(1, (1, 2, 3), 2, 5, (2, 3)), 4))  # a duplicate
    assert cache.take_changes() is None
    cache._partition_read("t", 1, answer(PartitionState(1, (1, 2, 3), 3, 6, (3,)), 5))
    cache._changed("nodes")  # anything but a partition state: the whole map again
    assert cache.take_changes() is None
    entry = cache.partition("t", 1)
    assert entry is not None and entry[1].leader == 3
    assert cache.partition("t", 0) is None and cache.partition("u", 0) is None

"""Each hosted partition's role on this node (leader, follower or none), decided in one place.

In the style of the ZeroMQ Guide's Binary Star (``bstar.py``): the states and events are
named constants, ``transition`` is the one function that maps (role, event) to the next
role and the action to take, and it raises on an impossible pair instead of guessing.
``apply`` runs a transition against the node; ``apply_roles`` turns the routing map from
ZooKeeper into events, and ``step_down_everywhere`` is the session's way out. Nothing
else in the node adds or removes a leadership or followership.

    role      event                         next      action
    any       ELECTED (epoch e)             LEADER    LEAD (KEEP if already leading at e)
    any       LEADER_ELSEWHERE (node l, e)  FOLLOWER  FOLLOW (KEEP if already following l at e)
    any       OFFLINE, UNHOSTED             NONE      DROP (KEEP if already NONE)
    LEADER    STEP_DOWN                     NONE      DROP
    FOLLOWER  STEP_DOWN                     impossible: only leaderships are stepped down
    NONE      STEP_DOWN                     impossible
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import zmq

from fabric import zk as zkl
from nodes import leader as leader_side
from nodes import produce
from nodes.follower import FollowerReplica
from nodes.leader import LeaderReplica
from nodes.log import PartitionLog, partition_key
from nodes.state import NodeState, TopicPartition

log = logging.getLogger("fabric.node")

# Roles (the states).
LEADER = "leader"
FOLLOWER = "follower"
NONE = "none"
ROLES = (LEADER, FOLLOWER, NONE)

# Events.
ELECTED = "elected"  # ZooKeeper names this node the partition's leader
LEADER_ELSEWHERE = "leader-elsewhere"  # ZooKeeper names another node
OFFLINE = "offline"  # no leader: no live in-sync replica
UNHOSTED = "unhosted"  # this node is no longer a replica, or the topic is gone
STEP_DOWN = "step-down"  # the ZooKeeper session is lost or unconfirmed: stop taking writes

# Actions.
KEEP = "keep"
LEAD = "lead"
FOLLOW = "follow"
DROP = "drop"


class ImpossibleTransitionError(RuntimeError):
    """A role event that cannot happen in the current role: a bug, never bad input."""


@dataclass(frozen=True)
class Role:
    name: str = NONE
    leader_id: int = -1  # the partition's leader as this node acts on it
    epoch: int = -1


@dataclass(frozen=True)
class Event:
    name: str
    leader_id: int = -1
    epoch: int = -1


def decide_role(state: zkl.PartitionState, node_id: int) -> str:
    """The role ZooKeeper's partition state gives this node."""
    if state.leader == node_id:
        return LEADER
    if node_id in state.replicas and state.leader >= 0:
        return FOLLOWER
    return NONE


def event_for(state: zkl.PartitionState, node_id: int) -> Event:
    role = decide_role(state, node_id)
    if role == LEADER:
        return Event(ELECTED, node_id, state.leader_epoch)
    if role == FOLLOWER:
        return Event(LEADER_ELSEWHERE, state.leader, state.leader_epoch)
    return Event(OFFLINE if node_id in state.replicas else UNHOSTED)


def transition(current: Role, event: Event) -> tuple[Role, str]:
    """The next role and the action that gets there. Raises on an impossible pair."""
    if current.name not in ROLES:
        raise ImpossibleTransitionError(f"unknown role {current.name!r}")
    if event.name == ELECTED:
        if current.name == LEADER and current.epoch == event.epoch:
            return current, KEEP
        return Role(LEADER, event.leader_id, event.epoch), LEAD
    if event.name == LEADER_ELSEWHERE:
        if event.leader_id < 0:
            raise ImpossibleTransitionError("follow a leader that does not exist: that is OFFLINE")
        if current.name == FOLLOWER and (current.leader_id, current.epoch) == (event.leader_id, event.epoch):
            return current, KEEP
        return Role(FOLLOWER, event.leader_id, event.epoch), FOLLOW
    if event.name in (OFFLINE, UNHOSTED):
        return (current, KEEP) if current.name == NONE else (Role(), DROP)
    if event.name == STEP_DOWN:
        if current.name != LEADER:
            # Followers take no writes and keep following; a step-down sent to one
            # means the caller lost track of which partitions it leads.
            raise ImpossibleTransitionError(f"step down from {current.name}: only a leader steps down")
        return Role(), DROP
    raise ImpossibleTransitionError(f"unknown event {event.name!r} in role {current.name}")


def current_role(node: NodeState, tp: TopicPartition) -> Role:
    leader = node.leaders.get(tp)
    if leader is not None:
        return Role(LEADER, node.node_id, leader.epoch)
    follower = node.followers.get(tp)
    if follower is not None:
        return Role(FOLLOWER, follower.leader_id, follower.epoch)
    return Role()


def apply(node: NodeState, tp: TopicPartition, event: Event, state: zkl.PartitionState | None = None) -> str:
    """Run one transition for ``tp`` and carry out its action; returns the action."""
    _role, action = transition(current_role(node, tp), event)
    if action == LEAD:
        if state is None:
            raise ImpossibleTransitionError("LEAD needs the partition state")
        _become_leader(node, tp, state)
    elif action == FOLLOW:
        _become_follower(node, tp, event)
    elif action == DROP:
        _drop(node, tp)
    return action


def _become_leader(node: NodeState, tp: TopicPartition, state: zkl.PartitionState) -> None:
    _drop(node, tp)
    plog = node.logs[tp]
    plog.assign_epoch(state.leader_epoch)
    node.leaders[tp] = LeaderReplica.start(node.node_id, state, plog.log_end_offset, time.monotonic())
    leader_side.replica_log(tp, state.leader_epoch).info(
        "leader of %s/%d at epoch %d from offset %d, isr %s", *tp, state.leader_epoch, plog.log_end_offset, list(state.isr))
    leader_side.update_high_watermark(node, tp)


def _become_follower(node: NodeState, tp: TopicPartition, event: Event) -> None:
    _drop(node, tp)
    node.followers[tp] = FollowerReplica(event.leader_id, event.epoch)
    pkey = partition_key(*tp)
    if pkey not in node.subscribed:
        node.sockets.sub.setsockopt(zmq.SUBSCRIBE, pkey)
        node.subscribed.add(pkey)
    leader_side.replica_log(tp, event.epoch).info("follower of %s/%d: leader %d epoch %d", *tp, event.leader_id, event.epoch)


def _drop(node: NodeState, tp: TopicPartition) -> None:
    if node.leaders.pop(tp, None) is not None:
        produce.complete_pending(node, {tp})  # their waits now fail with NOT_LEADER
    follower = node.followers.pop(tp, None)
    if follower is not None:
        node.replica_requests.pop(follower.request_in_flight, None)
        pkey = partition_key(*tp)
        if pkey in node.subscribed:
            node.sockets.sub.setsockopt(zmq.UNSUBSCRIBE, pkey)
            node.subscribed.discard(pkey)


def apply_roles(node: NodeState) -> None:
    """Open logs for hosted partitions and play the role the routing map gives each: only
    the partitions whose state changed, when the routing cache says that is all that did
    (``RoutingCache.take_changes``), else every partition."""
    node.routing_dirty = False
    changed = node.routing.take_changes()
    if changed is not None and _apply_changed(node, changed):
        return
    topics = node.routing.topics()
    seen: set[TopicPartition] = set()
    for name, route in topics.items():
        node.configs[name] = route.config
        for p, state in route.partitions.items():
            if node.node_id not in state.replicas:
                continue
            seen.add((name, p))
            _apply_partition(node, name, p, route.config, state)
    for tp in [tp for tp in node.logs if tp not in seen]:
        apply(node, tp, Event(UNHOSTED))
        moved_route = topics.get(tp[0])
        if tp[0] not in topics and tp[0] in node.known_topics:
            log.info("topic %s deleted: wiping %s/%d", tp[0], *tp)
        elif moved_route is not None and tp[1] in moved_route.partitions:
            # Reassigned away (nodes/reassign.py removes a replica only once the new ones
            # are in sync): this copy is no longer needed.
            log.info("%s/%d moved to nodes %s: wiping this copy", *tp, list(moved_route.partitions[tp[1]].replicas))
        else:
            continue
        node.logs.pop(tp).wipe()
        node.states.pop(tp, None)
        node.pkeys.pop(partition_key(*tp), None)
    node.known_topics = set(topics)
    for name in [name for name in node.configs if name not in topics]:
        del node.configs[name]  # a deleted topic's: topics created and deleted in a loop grew it for ever
    # Stop reconnecting to replication streams of processes that are gone (a restarted
    # node publishes on a new port).
    live = {n.replication_address for n in node.routing.nodes().values()}
    # Only marked here: the SUB is disconnected after the stream is next drained (see
    # follower.disconnect_streams for why it cannot happen now).
    for address in node.sub_connected - live:
        node.sub_connected.discard(address)
        node.sub_disconnect_pending.add(address)


def _apply_changed(node: NodeState, changed: set[TopicPartition]) -> bool:
    """Play the roles of just these partitions; False (nothing done) if one needs the whole
    pass: no longer hosted here (its copy may have to go), or of a topic deleted or created
    again meanwhile. At 2,000 partitions the whole pass per changed partition was 30-40 %
    of a restarting node's time (docs/BENCHMARKS.md, "Many partitions")."""
    found = []
    for name, p in changed:
        entry = node.routing.partition(name, p)
        if entry is None or node.node_id not in entry[1].replicas or node.configs.get(name) != entry[0]:
            return False
        plog = node.logs.get((name, p))
        if plog is not None and plog.incarnation != entry[0].created_ms:
            return False
        found.append((name, p, entry))
    for name, p, (config, state) in found:
        _apply_partition(node, name, p, config, state)
    return True


def _apply_partition(node: NodeState, name: str, p: int, config: zkl.TopicConfig, state: zkl.PartitionState) -> None:
    """Open the log of a partition hosted here if needed, and play the role ``state`` gives."""
    tp = (name, p)
    stale = node.logs.get(tp)
    if stale is not None and stale.incarnation != config.created_ms:
        # Deleted and created again while we did not look (paused, or cut off): our
        # copy and our role belong to the old topic. Without this the old log was
        # kept, and served to the new topic's replicas (docs/ZOOKEEPER.md).
        log.warning("%s/%d: the topic was deleted and created again: wiping the old copy", *tp)
        apply(node, tp, Event(UNHOSTED))
        node.logs.pop(tp).wipe()
        node.states.pop(tp, None)
    if tp not in node.logs:
        node.logs[tp] = PartitionLog(node.store, name, p, config.created_ms)
        node.pkeys[partition_key(name, p)] = tp
    old = node.states.get(tp)
    if old is not None and old.version > state.version:
        return  # we already hold a newer state (one we wrote ourselves)
    node.states[tp] = state
    action = apply(node, tp, event_for(state, node.node_id), state)
    leader = node.leaders.get(tp)
    if action == KEEP and leader is not None and old is not None and old.version < state.version:
        leader.isr = set(state.isr) | {node.node_id}  # the same term, a newer ISR
        leader.set_replicas(state.replicas, time.monotonic())  # or replicas (a reassignment)


def step_down_everywhere(node: NodeState, why: str) -> None:
    if node.leaders:
        log.warning("stepping down from %d leaderships: %s", len(node.leaders), why)
    for tp in list(node.leaders):
        apply(node, tp, Event(STEP_DOWN))
        node.states.pop(tp, None)  # forget it, so the next routing view is applied afresh

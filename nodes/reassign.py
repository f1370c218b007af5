"""Partition reassignment: move a partition's replicas to other nodes without losing a write.

As Kafka does it (KIP-455), the controller owns the decision and the move has two steps:

1. ``begin``: the partition state gets the union of the old and new replicas, with
   ``adding`` (new replicas) and ``removing`` (old ones not in the new list). The new
   replicas are followers from then on: they fetch the log from the leader, their
   catch-up fetches held to ``throttle_bytes_per_s`` (``nodes/follower.py``), and the
   leader adds each to the ISR once it has caught up, as for any follower
   (``leader.isr_change``). Nothing is removed yet, so acks=all writes still wait for
   every old in-sync replica.
2. ``complete``: once every adding replica is in the ISR, the controller writes the final
   state: only the new replicas, the ISR cut to them, and, if the leader is being removed,
   a new leader from the new replicas in the ISR (epoch + 1, which fences the old one). A
   removed replica stops serving the partition and deletes its copy (``nodes/roles.py``).

Both writes are version-checked, like every partition state write: a leader changing the
ISR meanwhile makes the controller's write fail and the next round decide again. ``begin``
is also checked against the topic config it read (its ``min_insync``), in the same
transaction; a move to fewer copies rewrites that config, so a raise of ``min_insync``
decided from the copies before it fails too (``zkl.write_partition_state_with_config``).
``describe_replicas`` answers DESCRIBE_REPLICAS: each node's own copy (range, size), so
``fabric topic describe`` can show a moving replica's progress.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping
from typing import Any

from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError

from fabric import errors, limits
from fabric import zk as zkl
from fabric.protocol import apis
from fabric.wording import plural
from fabric.zk import PartitionState, TopicConfig
from nodes.state import Envelope, NodeState

log = logging.getLogger("fabric.controller")

THROTTLE_BYTES_PER_S_MIN = limits.REASSIGN_THROTTLE_BYTES_PER_S_MIN  # below this a catch-up would take forever


def begin(state: PartitionState, target: tuple[int, ...], throttle_bytes_per_s: int, registered: set[int],
          min_insync: int) -> PartitionState | None:
    """The state that starts moving ``state`` to ``target``; None if nothing needs to change.

    Raises ``InvalidRequestError`` / ``InvalidReplicationFactorError`` on a bad target and
    ``ReassignmentInProgressError`` if a different move is running."""
    if not target:
        raise errors.InvalidRequestError("replicas: give at least one node id")
    if len(set(target)) != len(target):
        raise errors.InvalidRequestError(f"replicas {list(target)}: a node appears twice")
    if len(target) > zkl.REPLICATION_FACTOR_MAX:
        raise errors.InvalidReplicationFactorError(f"{len(target)} replicas: at most {zkl.REPLICATION_FACTOR_MAX}")
    if len(target) < min_insync:
        raise errors.InvalidReplicationFactorError(
            f"replicas {list(target)}: {plural(len(target), 'node')}, fewer than the topic's min_insync={min_insync}: "
            "acks=all writes would all fail")
    if throttle_bytes_per_s < 0 or 0 < throttle_bytes_per_s < THROTTLE_BYTES_PER_S_MIN:
        raise errors.InvalidRequestError(
            f"throttle_bytes_per_s={throttle_bytes_per_s}: 0 (none) or at least {THROTTLE_BYTES_PER_S_MIN}")
    if state.reassigning:
        if tuple(r for r in state.replicas if r not in state.removing) == target:
            if throttle_bytes_per_s == state.throttle_bytes_per_s:
                return None  # the same move again: already under way
            return dataclasses.replace(state, throttle_bytes_per_s=throttle_bytes_per_s)  # a new rate for it
        raise errors.ReassignmentInProgressError(
            f"partition {state.partition} is moving to {[r for r in state.replicas if r not in state.removing]}")
    unknown = [r for r in target if r not in registered and r not in state.replicas]
    if unknown:
        raise errors.InvalidRequestError(f"replicas {unknown} are not registered nodes")
    if target == state.replicas:
        return None
    adding = tuple(r for r in target if r not in state.replicas)
    removing = tuple(r for r in state.replicas if r not in target)
    if not adding and not removing:
        return dataclasses.replace(state, replicas=target)  # a new order only: nothing to copy
    return dataclasses.replace(state, replicas=target + removing, adding=adding, removing=removing,
                               throttle_bytes_per_s=throttle_bytes_per_s)


def cancel(state: PartitionState, live: set[int]) -> PartitionState:
    """The state that stops a running move: the replicas it was adding go (their partial
    copies are deleted), those it was removing stay. Raises if there is nothing to cancel,
    or if only a new replica could lead now (it is in sync: finish the move instead)."""
    if not state.reassigning:
        raise errors.InvalidRequestError(f"partition {state.partition} is not moving: nothing to cancel")
    original = tuple(r for r in state.replicas if r not in state.adding)
    isr = tuple(r for r in state.isr if r in original)
    leader, epoch = state.leader, state.leader_epoch
    if leader >= 0 and leader not in original:
        candidates = [r for r in original if r in isr and r in live]
        if not candidates:
            raise errors.InvalidRequestError(
                f"partition {state.partition}: only the new replicas {list(state.adding)} can lead now; "
                "let the move finish")
        leader, epoch = candidates[0], epoch + 1
    return dataclasses.replace(state, replicas=original, isr=isr, leader=leader, leader_epoch=epoch,
                               adding=(), removing=(), throttle_bytes_per_s=0)


def complete(state: PartitionState, live: set[int]) -> PartitionState | None:
    """The final state once every adding replica is in sync; None while it is not yet time."""
    if not state.reassigning or not set(state.adding) <= set(state.isr) or state.leader < 0:
        return None
    target = tuple(r for r in state.replicas if r not in state.removing)
    isr = tuple(r for r in state.isr if r in target)
    leader, epoch = state.leader, state.leader_epoch
    if leader not in target:
        candidates = [r for r in target if r in isr and r in live]
        if not candidates:
            return None  # no new replica can lead right now: keep all of them until one can
        leader, epoch = candidates[0], epoch + 1
    return dataclasses.replace(state, replicas=target, isr=isr, leader=leader, leader_epoch=epoch,
                               adding=(), removing=(), throttle_bytes_per_s=0)


def grow_internal(state: PartitionState, live: set[int], load: Mapping[int, int], factor: int) -> PartitionState | None:
    """The move that gives an internal topic's partition the copies it lacks: it was created
    with as many replicas as nodes were up then (a one-node development cluster, a node down
    at the first group commit), and would otherwise stay that fragile for good. Live nodes
    not yet replicas join it, least loaded first, through an ordinary move (``begin``, then
    ``complete`` once they are in sync). None when nothing is to be done."""
    if state.reassigning or state.leader < 0 or len(state.replicas) >= factor:
        return None
    spare = sorted((n for n in live if n not in state.replicas), key=lambda n: (load.get(n, 0), n))
    if not spare:
        return None
    target = state.replicas + tuple(spare[:factor - len(state.replicas)])
    return begin(state, target, 0, live | set(state.replicas), min_insync=1)


def grown_internal_config(topic: str, config: TopicConfig, states: Collection[PartitionState]) -> TopicConfig | None:
    """An internal topic's config once its partitions have more copies than it was made
    with (``grow_internal``, or an operator's ``fabric topic reassign``): the replication
    factor the fewest copies any partition has for good, and ``min_insync`` min(2, that),
    as creation on that many nodes would have set them. A moving partition counts the
    smaller of its old and new replica lists: acks=all writes must not be refused while
    its new replicas catch up. Only ever raises either: a move to fewer copies leaves
    them (``begin`` refuses fewer than ``min_insync``). None when nothing rises, a
    partition is missing, or ``topic`` is a user's: theirs keep what their users set."""
    if not apis.is_internal_topic(topic) or len(states) != config.partitions or not states:
        return None
    settled = zkl.settled_copies(states)
    factor, min_insync = max(config.replication_factor, settled), max(config.min_insync, min(2, settled))
    if (factor, min_insync) == (config.replication_factor, config.min_insync):
        return None
    return dataclasses.replace(config, replication_factor=factor, min_insync=min_insync)


def raise_internal_config(node: NodeState, topic: str) -> None:
    """On the ZooKeeper worker (a controller round): write ``grown_internal_config`` to the
    topic's znode, as ALTER_TOPIC_CONFIGS would, so every node's acks=all check uses it.
    One transaction, version-checked on the config and on every partition state it was
    decided from; a race, or ZooKeeper away, leaves it to the next round."""
    try:
        raw, stat = zkl.get(node.zk, zkl.topic_path(topic))
        config = TopicConfig.decode(raw)
        states = zkl.read_partition_states(node.zk, topic, config.partitions)
        raised = grown_internal_config(topic, config, states)
        if raised is None:
            return
        # A move to fewer copies begun since these reads fails both checks: it changed its
        # partition's state, and rewrote the config (zkl.write_partition_state_with_config).
        # One begun after this commit is checked against the raised min_insync.
        tx = node.zk.transaction()
        for state in states:
            tx.check(zkl.partition_path(topic, state.partition), state.version)
        tx.set_data(zkl.topic_path(topic), raised.encode(), version=stat.version)
        zkl.commit_all(tx, f"topic {topic!r} transaction")
    except Exception as exc:  # a race, or ZooKeeper away: the next round decides again
        if not isinstance(exc, (BadVersionError, NoNodeError, RolledBackError)):
            log.warning("controller: raising %s's min_insync failed: %s: %s", topic, type(exc).__name__, exc)
        node.controller_dirty = True
        return
    log.info("controller: %s has %d copies of every partition: replication_factor %d -> %d, min_insync %d -> %d",
             topic, raised.replication_factor, config.replication_factor, raised.replication_factor,
             config.min_insync, raised.min_insync)


def catch_up_throttle(state: PartitionState | None, node_id: int) -> int:
    """The fetch byte-rate limit this node applies to a partition (0 = none): only while it
    is one of the replicas being added."""
    if state is None or node_id not in state.adding:
        return 0
    return state.throttle_bytes_per_s


# -- the handlers --------------------------------------------------------------------------
def handle_reassign(node: NodeState, envelope: Envelope, request: apis.Message) -> None:
    """REASSIGN_PARTITION (docs/PROTOCOL.md 5.18): the controller starts the move."""
    body = request.body
    if not node.is_controller:
        node.send_response(envelope, request.header, {
            "error": errors.NotControllerError.code,
            "message": f"node {node.node_id} is not the controller (ask node {node.routing.controller_id})"})
        return
    node.answer_later(envelope, request.header, lambda: _begin_in_zookeeper(
        node, body["topic"], body["partition"], tuple(body["replicas"]), body["throttle_bytes_per_s"]))


def _begin_in_zookeeper(node: NodeState, topic: str, partition: int, target: tuple[int, ...],
                        throttle_bytes_per_s: int) -> dict[str, Any]:
    """On the ZooKeeper worker: read the topic config and the partition state, decide,
    write in one transaction with the config (``zkl.write_partition_state_with_config``).
    The ``min_insync`` a target is checked against is the config's in ZooKeeper, not this
    node's cached copy: a raise of it just committed (the controller's of an internal
    topic, ALTER_TOPIC_CONFIGS) is seen, and one committed between the read and the write
    fails the write, which reads and decides again. Either way a partition is never moved
    to fewer copies than its topic's ``min_insync``."""
    try:
        for _ in range(zkl.TOPIC_TRANSACTION_TRIES):
            try:
                raw_config, config_stat = zkl.get(node.zk, zkl.topic_path(topic))
            except NoNodeError:
                raise errors.UnknownTopicOrPartitionError(f"unknown topic {topic!r}") from None
            try:
                raw, stat = zkl.get(node.zk, zkl.partition_path(topic, partition))
            except NoNodeError:
                raise errors.UnknownTopicOrPartitionError(f"{topic} has no partition {partition}") from None
            config = TopicConfig.decode(raw_config)
            state = PartitionState.decode(partition, raw, stat.version)
            live = set(zkl.live_nodes(node.zk))
            # No replicas: cancel the running move (docs/PROTOCOL.md 5.18).
            new_state = cancel(state, live) if not target else \
                begin(state, target, throttle_bytes_per_s, live, config.min_insync)
            if new_state is None:
                break
            try:
                written = zkl.write_partition_state_with_config(node.zk, topic, state, new_state, raw_config,
                                                                config_stat.version)
            except (BadVersionError, NoNodeError):
                continue  # the config or the partition changed (or the topic went): read and decide again
            node.routing.apply_partition_state(topic, written)
            node.routing_dirty = True
            node.controller_dirty = True  # nothing to add (a removal only) completes at once
            break
        else:
            raise errors.RequestTimedOutError(
                f"partition {topic}/{partition} kept changing while the move was decided "
                f"({zkl.TOPIC_TRANSACTION_TRIES} tries); try again")
    except errors.FabricError as exc:
        return {"error": exc.code, "message": exc.message}
    return {"error": 0, "message": ""}


def handle_describe_replicas(node: NodeState, _envelope: Envelope, request: apis.Message) -> dict[str, Any]:
    """DESCRIBE_REPLICAS: this node's copy of each partition it hosts."""
    wanted = set(request.body["topics"])
    out = []
    for tp, plog in sorted(node.logs.items()):
        if wanted and tp[0] not in wanted:
            continue
        state = node.states.get(tp)
        role = "leader" if tp in node.leaders else "follower" if tp in node.followers else "none"
        out.append({
            "topic": tp[0], "partition": tp[1], "role": role,
            "leader_epoch": state.leader_epoch if state is not None else -1,
            "log_start_offset": plog.log_start_offset, "log_end_offset": plog.log_end_offset,
            "high_watermark": plog.high_watermark, "size_bytes": plog.total_bytes,
            "adding": list(state.adding) if state is not None else [],
            "removing": list(state.removing) if state is not None else [],
            "throttle_bytes_per_s": state.throttle_bytes_per_s if state is not None else 0,
        })
    return {"node_id": node.node_id, "partitions": out}

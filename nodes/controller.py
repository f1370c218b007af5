"""The controller: decisions as pure functions, and the controller's duties in the loop.

Decisions (``elect``, ``prefer``) map (partition state, live nodes) to a new state.

One node is the controller (it holds the ephemeral ``/fabric/controller`` znode). When a
leader's ephemeral node disappears, or an offline partition's ISR member comes back, the
controller writes a new partition state with a version-checked set: a deposed controller
(or a leader acting on old state) fails its write instead of overwriting a newer decision.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from fabric import errors
from fabric import zk as zkl
from fabric.protocol import apis
from fabric.zk import PartitionState
from nodes import reassign
from nodes.state import Envelope, NodeState

log = logging.getLogger("fabric.controller")

CONTROLLER_RECONCILE_INTERVAL_S = 2.0
# Partition states read, decided and written per pipelined batch: the requests one batch
# keeps outstanding at ZooKeeper at once (about 100 KB of them), and the most one stale
# snapshot of the live nodes decides.
CONTROLLER_PIPELINE_PARTITIONS_MAX = 500

Decide = Callable[[PartitionState, set[int]], "PartitionState | None"]


def elect(state: PartitionState, live: set[int], *, unclean: bool = False) -> PartitionState | None:
    """The state after electing a leader if the current one is gone; None if nothing changes.

    Clean election: the first live replica (in preferred order) that is in the ISR. The
    dead leader leaves the ISR. If no ISR member is alive, the partition goes offline
    (leader -1) and keeps its ISR, so the first of those members to return is elected and
    nothing it acknowledged is lost. Unclean election (per topic, off by default) picks
    any live replica instead and may lose acknowledged writes; it is logged as an error.
    """
    if state.leader >= 0 and state.leader in live:
        return None
    candidates = [r for r in state.replicas if r in state.isr and r in live]
    if candidates:
        leader = candidates[0]
        isr = tuple(r for r in state.isr if r in live)
        return dataclasses.replace(state, leader=leader, leader_epoch=state.leader_epoch + 1, isr=isr)
    if unclean:
        live_replicas = [r for r in state.replicas if r in live]
        if live_replicas:
            leader = live_replicas[0]
            log.error(
                "UNCLEAN leader election of partition %d: node %d was not in the ISR %s; "
                "acknowledged writes may be lost",
                state.partition, leader, list(state.isr),
            )
            return dataclasses.replace(state, leader=leader, leader_epoch=state.leader_epoch + 1, isr=(leader,))
    if state.leader >= 0:
        return dataclasses.replace(state, leader=-1, leader_epoch=state.leader_epoch + 1)
    return None


def prefer(state: PartitionState, live: set[int]) -> PartitionState | None:
    """Move leadership to the first replica if it is alive and in the ISR."""
    preferred = state.replicas[0]
    if state.leader == preferred or preferred not in state.isr or preferred not in live:
        return None
    return dataclasses.replace(state, leader=preferred, leader_epoch=state.leader_epoch + 1)


# -- the controller's duties in the node loop ----------------------------------------------
def tick(node: NodeState, _now: float) -> None:
    """A loop duty: run a controller round (claim the role if free, then reconcile
    leaders) on the ZooKeeper worker, one round at a time."""
    if not node.session_ok() or "controller" in node.jobs:
        return  # dirty stays set: the next round runs when this one is done
    node.controller_dirty = False
    was_controller = node.is_controller
    try:
        node.zk_worker.submit(lambda: _round(node, was_controller), lambda r, e: _round_done(node, r, e))
    except errors.NodeNotReadyError:
        node.controller_dirty = True
        return
    node.jobs.add("controller")


def _round(node: NodeState, is_controller: bool) -> bool:
    """On the worker: claim the controller znode if it is free, then reconcile."""
    if node.routing.controller_id < 0 and not is_controller:
        try:
            zkl.create(node.zk, zkl.CONTROLLER, str(node.node_id).encode(), ephemeral=True)
            is_controller = True
            log.info("node %d is the controller", node.node_id)
        except NodeExistsError:
            pass
    elif is_controller and node.routing.controller_id not in (-1, node.node_id):
        is_controller = False
    if is_controller:
        reconcile_leaders(node)
    return is_controller


def _round_done(node: NodeState, is_controller: Any, error: BaseException | None) -> None:
    node.jobs.discard("controller")
    if error is not None:
        log.warning("controller round failed (will retry): %s: %s", type(error).__name__, error)
        node.controller_dirty = True
        return
    node.is_controller = bool(is_controller) and not node.session_lost


def is_due(node: NodeState) -> bool:
    """Run the controller duty now, before its interval: the routing map changed."""
    return node.controller_dirty


def reconcile_leaders(node: NodeState) -> None:
    """Elect a leader wherever the current one is gone (or an offline ISR member is back),
    finish reassignments whose new replicas are all in sync, give internal topics the
    copies they were created without, and then the min_insync those copies allow
    (nodes/reassign.py).

    Runs on the ZooKeeper worker: it reads the routing cache (thread-safe snapshots),
    writes ZooKeeper with version checks and only flips the loop's dirty flags."""
    live = set(node.routing.nodes())
    topics = node.routing.topics()
    load = collections.Counter(r for route in topics.values() for state in route.partitions.values()
                               for r in state.replicas)
    grow = functools.partial(reassign.grow_internal, load=load, factor=apis.INTERNAL_REPLICATION_FACTOR)
    wanted: list[tuple[str, int, Decide]] = []
    for name, route in topics.items():
        elect_here = functools.partial(elect, unclean=route.config.unclean_leader_election)
        deciders = (elect_here, reassign.complete, grow) if apis.is_internal_topic(name) else (
            elect_here, reassign.complete)
        for p, cached in route.partitions.items():
            for decide in deciders:
                if decide(cached, live) is not None:
                    wanted.append((name, p, decide))
                    break
    for start in range(0, len(wanted), CONTROLLER_PIPELINE_PARTITIONS_MAX):
        decide_and_write(node, wanted[start:start + CONTROLLER_PIPELINE_PARTITIONS_MAX])
    # A grown internal topic's min_insync follows its copies (decided on the cache, which
    # the writes above updated; written from fresh reads).
    for name in [name for name in topics if apis.is_internal_topic(name)]:
        now = node.routing.topic(name)
        if now is not None and reassign.grown_internal_config(name, now.config, now.partitions.values()) is not None:
            reassign.raise_internal_config(node, name)


def decide_and_write(node: NodeState, batch: list[tuple[str, int, Decide]], live: set[int] | None = None) -> int:
    """Decide again on fresh states read from ZooKeeper, and write them version-checked;
    returns how many were written. The reads, then the writes, are pipelined
    (``zk.get_many``/``set_many``): a failed node's 667 leaderships took 19-31 s of serial
    round trips (six per partition, the live nodes read again for each), longer than a
    draining node's followers keep it in their ISR (docs/BENCHMARKS.md, "Many partitions").
    ``live``: the live nodes to decide with; None reads them from ZooKeeper once for the batch."""
    try:
        live_now = set(zkl.live_nodes(node.zk)) if live is None else live
        reads = zkl.get_many(node.zk, [zkl.partition_path(name, p) for name, p, _ in batch])
    except Exception as exc:  # ZooKeeper away: the next round tries again
        log.warning("controller: reading %d partition states failed: %s: %s", len(batch), type(exc).__name__, exc)
        node.controller_dirty = True
        return 0
    decided: list[tuple[str, PartitionState, PartitionState]] = []
    for (name, p, decide), read in zip(batch, reads, strict=True):
        if isinstance(read, Exception):
            _failed(node, name, p, read)
            continue
        raw, stat = read
        state = zkl.PartitionState.decode(p, raw, stat.version)
        new_state = decide(state, live_now)
        if new_state is not None:
            decided.append((name, state, new_state))
    results = zkl.set_many(node.zk, [(zkl.partition_path(name, new.partition), new.encode(), new.version)
                                     for name, _old, new in decided])
    written_count = 0
    for (name, state, new_state), result in zip(decided, results, strict=True):
        if isinstance(result, Exception):
            _failed(node, name, new_state.partition, result)
            continue
        written = dataclasses.replace(new_state, version=result.version)
        node.routing.apply_partition_state(name, written)
        node.routing_dirty = True
        written_count += 1
        log.info("controller: %s/%d leader %d -> %d, epoch %d, replicas %s, isr %s", name, written.partition,
                 state.leader, written.leader, written.leader_epoch, list(written.replicas), list(written.isr))
    return written_count


def _failed(node: NodeState, name: str, p: int, error: Exception) -> None:
    """A partition's read or write failed: the next round decides it again."""
    if not isinstance(error, (BadVersionError, NoNodeError)):  # those are races, not trouble
        log.warning("controller decision for %s/%d failed: %s: %s", name, p, type(error).__name__, error)
    node.controller_dirty = True


def handle_elect_leaders(node: NodeState, envelope: Envelope, request: apis.Message) -> None:
    """ELECT_LEADERS: move leadership back to the preferred replicas (controller only),
    on the ZooKeeper worker."""
    topics: list[str] = request.body["topics"]
    if not node.is_controller:
        # In the body, as docs/PROTOCOL.md section 5.11 says: the request was well formed.
        node.send_response(envelope, request.header, {
            "error": errors.NotControllerError.code, "moved": 0,
            "message": f"node {node.node_id} is not the controller (ask node {node.routing.controller_id})"})
        return
    node.answer_later(envelope, request.header, lambda: _elect_preferred(node, topics))


def _elect_preferred(node: NodeState, topics: list[str]) -> dict[str, Any]:
    live = set(zkl.live_nodes(node.zk))
    wanted: list[tuple[str, int, Decide]] = [(name, p, prefer) for name, route in node.routing.topics().items()
                                             if not topics or name in topics for p in route.partitions]
    moved = 0
    for start in range(0, len(wanted), CONTROLLER_PIPELINE_PARTITIONS_MAX):
        moved += decide_and_write(node, wanted[start:start + CONTROLLER_PIPELINE_PARTITIONS_MAX], live)
    return {"error": 0, "message": "", "moved": moved}


# The controller's APIs, in the node's DISPATCH (reassignment: nodes/reassign.py).
APIS: dict[int, Callable[[NodeState, Envelope, apis.Message], dict[str, Any] | None]] = {
    apis.ApiKey.ELECT_LEADERS: handle_elect_leaders,
    apis.ApiKey.REASSIGN_PARTITION: reassign.handle_reassign,
    apis.ApiKey.DESCRIBE_REPLICAS: reassign.handle_describe_replicas,
}

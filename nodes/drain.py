"""Controlled shutdown: hand every leadership away before the process stops.

SIGTERM starts it (SIGINT, or a second SIGTERM, stops at once). Kafka's controlled
shutdown asks the controller to move the broker's leaderships first; we get the same
effect with the machinery a failed node already uses, which the fault tests exercise:

1. The node deletes its registration znode but keeps its session, its sockets and its
   data. To the controller it is gone, so it elects a new leader from the ISR for every
   partition this node led (the ISR without this node); leaders of partitions it follows
   drop it from their ISR at once (``leader.check_isr``), so acks=all writes stop
   waiting for it.
2. Meanwhile it refuses writes with NOT_LEADER (a producer refreshes its metadata at
   once and resends to the new leader; the idempotent producer makes that harmless)
   and keeps answering fetches, so nothing is left unanswered while clients move.
3. It stops once it leads nothing that another live in-sync replica could take, plus a
   short grace for answers in flight, or after ``DRAIN_TIMEOUT_S`` whatever remains.

A partition whose only live in-sync replica is this node goes offline when it stops, as
it would on a crash; the drain does not wait for what cannot happen.
"""

from __future__ import annotations

import logging
import signal
from typing import Any, Final

from kazoo.exceptions import NoNodeError

from fabric import errors
from fabric import zk as zkl
from fabric.protocol import apis
from nodes.state import Envelope, NodeState

log = logging.getLogger("fabric.node")

DRAIN_TIMEOUT_S: Final[float] = 10.0  # the longest a SIGTERM waits for leaderships to move
DRAIN_GRACE_S: Final[float] = 0.2  # after the last move: answer what is in flight
DRAIN_CHECK_INTERVAL_S: Final[float] = 0.05


def install_signals(node: NodeState, stop: Any) -> None:
    """SIGTERM drains (a second one stops at once); SIGINT stops at once."""
    def on_term(_signum: int, _frame: Any) -> None:
        if node.draining_since:
            stop()
        else:
            node.drain_requested = True
            node.wake()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, lambda _signum, _frame: stop())


def tick(node: NodeState, now: float) -> None:
    """A loop duty: start a requested drain, and stop the node once it is done."""
    if node.drain_requested and not node.draining_since:
        begin(node, now)
    if not node.draining_since:
        return
    movable = [tp for tp in node.leaders if _another_can_lead(node, tp)]
    if now - node.draining_since >= DRAIN_TIMEOUT_S:
        log.warning("drain: %d leaderships did not move within %.0f s; stopping anyway", len(movable), DRAIN_TIMEOUT_S)
        node.stopping.set()
    elif movable:
        node.drained_at_s = 0.0
    elif not node.drained_at_s:
        node.drained_at_s = now
        log.info("drain: leads nothing another replica could take (%.2f s); stopping", now - node.draining_since)
    elif now - node.drained_at_s >= DRAIN_GRACE_S:
        node.stopping.set()


def begin(node: NodeState, now: float) -> None:
    node.draining_since = now
    log.info("draining: leaving the cluster's live nodes so leaderships move, then stopping (node %d leads %d)",
             node.node_id, len(node.leaders))

    def deregister() -> None:
        try:
            _, stat = zkl.get(node.zk, zkl.node_path(node.node_id))
            if stat.owner_session_id == node.zk.client_id[0]:
                node.zk.delete_async(zkl.node_path(node.node_id), version=stat.version).get(timeout=zkl.ZK_OP_TIMEOUT_S)
        except NoNodeError:
            pass

    def done(_result: Any, error: BaseException | None) -> None:
        if error is not None:  # the node stops at the timeout, or at once if ZooKeeper is away
            # named by type: kazoo's ConnectionLoss and timeouts carry no message
            log.warning("drain: could not deregister (%s: %s); stopping", type(error).__name__, error)
            node.stopping.set()

    try:
        node.zk_worker.submit(deregister, done)
    except errors.NodeNotReadyError:
        node.stopping.set()


def handle_drain(node: NodeState, envelope: Envelope, request: apis.Message) -> None:
    """DRAIN_NODE (docs/PROTOCOL.md 5.17): begin the controlled shutdown SIGTERM would."""
    wanted = request.body["node_id"]
    if wanted != node.node_id:
        node.send_response(envelope, request.header, {
            "error": errors.InvalidRequestError.code, "leaderships": 0,
            "message": f"this is node {node.node_id}, not node {wanted}: nothing drained"})
        return
    log.info("drain requested over the wire")
    node.drain_requested = True
    node.send_response(envelope, request.header, {"error": 0, "message": "", "leaderships": len(node.leaders)})


def check_writable(node: NodeState, topic: str, partition: int) -> None:
    """Writes go elsewhere while draining: NOT_LEADER sends the producer to the new leader."""
    if node.draining_since:
        raise errors.NotLeaderError(f"node {node.node_id} is shutting down and handing {topic}/{partition} over")


def _another_can_lead(node: NodeState, tp: tuple[str, int]) -> bool:
    state = node.states.get(tp)
    if state is None:
        return False
    live = node.routing.nodes()
    return any(r != node.node_id and r in live for r in state.isr)

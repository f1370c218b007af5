"""While a node waits to start, every request is answered NODE_NOT_READY.

The client ROUTER is bound before the start (the node's address, a random port included,
goes into its registration), and two steps of the start can wait long: connecting to
ZooKeeper (up to ``ZK_START_TIMEOUT_S`` when it is slow or away), and registering, which a
node restarted after a crash cannot do until its previous process's ZooKeeper session
has expired (up to ``session_timeout_ms``). A client that connected meanwhile, because
the routing map still names this address, got no answer at all until the loop began, and
then answers to requests it had long given up on: a clean-room client written from
docs/PROTOCOL.md saw 4.5 s of silence after a `kill -9` and a restart.

So those two waits are spent answering each request at once with the request-level error
NODE_NOT_READY (retriable: the client asks another node, or again after its backoff),
saying why; the request had no effect. Nothing else uses the ROUTER before the loop runs,
and this runs on the starting thread, so no socket is shared. Requests that come in the
short steps between, or once the node has registered, wait for the loop as before: once
registered, the node is about to serve, and a refusal then would only send a client that
found it in ZooKeeper away.
"""

from __future__ import annotations

import time
from typing import Final

import zmq

from fabric import errors
from fabric.protocol.header import readable_header
from fabric.transport import recv_if_ready
from nodes.state import NodeState

# Requests answered per poll, so a long burst does not hold up the wait's end.
DRAIN_MESSAGES_MAX: Final[int] = 256
# How often connecting to ZooKeeper is checked on while refusing.
ZK_START_CHECK_S: Final[float] = 0.05


def refuse_for(node: NodeState, wait_s: float, why: str) -> None:
    """Spend ``wait_s`` answering every request NODE_NOT_READY (``why`` says what the node waits for)."""
    router = node.sockets.router
    deadline = time.monotonic() + wait_s
    while (left_s := deadline - time.monotonic()) > 0:
        if not router.poll(max(1, int(left_s * 1000)), zmq.POLLIN):
            continue
        for _ in range(DRAIN_MESSAGES_MAX):
            frames = recv_if_ready(router)
            if frames is None:
                break
            # DEALER peers send [id, header, body...]; REQ peers add an empty delimiter.
            cut = 2 if len(frames) >= 2 and len(frames[1]) == 0 else 1
            envelope, message = frames[:cut], frames[cut:]
            header = readable_header(message[0].bytes) if message else None
            node.send_error(envelope, header, errors.NodeNotReadyError(
                f"node {node.node_id} is starting ({why}): ask another node, or again shortly"))


def start_zookeeper(node: NodeState, timeout_s: float) -> None:
    """``KazooClient.start(timeout_s)``, refusing requests while it connects."""
    connected = node.zk.start_async()
    deadline = time.monotonic() + timeout_s
    while not connected.is_set() and time.monotonic() < deadline:
        refuse_for(node, min(ZK_START_CHECK_S, deadline - time.monotonic()), "connecting to ZooKeeper")
    if not node.zk.connected:  # as KazooClient.start: stopped, and the same exception
        node.zk.stop()
        node.zk.close()
        raise node.zk.handler.timeout_exception("Connection time-out")

"""A node that is starting answers every request NODE_NOT_READY (nodes/starting.py).

A node restarted after a crash cannot register until its previous process's ZooKeeper
session has expired; meanwhile its port accepted connections and answered nothing, then
answered requests the client had long given up on (a clean-room client written from
docs/PROTOCOL.md saw 4.5 s of silence after a `kill -9`). Here the previous incarnation's
registration is held by a ZooKeeper session of the test's own, so the wait is as long as
the test wants, not a race with the session timeout.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalNode, LocalZooKeeper, free_port
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey

ANSWER_WAIT_MS = 20_000  # a node process starts (imports, ZooKeeper) well within this
RETRY_MS = 50


@pytest.fixture
def dealer() -> Iterator[zmq.Socket[Any]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        yield sock
    finally:
        sock.close(linger=0)
        ctx.term()


def ask(sock: zmq.Socket[Any], correlation_id: int) -> apis.Message:
    sock.send_multipart(apis.encode_request(ApiKey.API_VERSIONS, {}, correlation_id))
    assert sock.poll(ANSWER_WAIT_MS), "no answer"
    return apis.decode_response(sock.recv_multipart())


def test_a_node_waiting_to_register_answers_node_not_ready_then_serves(
        zk_server: LocalZooKeeper, tmp_path: Path, dealer: zmq.Socket[Any]) -> None:
    chroot = f"/fabric-test-{uuid.uuid4().hex[:12]}"
    holder = zkl.make_client(zk_server.address + chroot)
    port = free_port()
    node = LocalNode(1, zk_server.address + chroot, tmp_path, extra_args=[f"--port={port}"])
    try:
        root = zkl.make_client(zk_server.address)
        root.start(timeout=10)
        try:
            zkl.ensure_path(root, chroot)
        finally:
            root.stop()
            root.close()
        holder.start(timeout=10)
        # The previous incarnation's registration, its session not expired yet.
        previous = zkl.NodeInfo(node_id=1, address=f"tcp://127.0.0.1:{port}")
        zkl.create(holder, zkl.node_path(1), previous.encode(), ephemeral=True, makepath=True)
        node.start()
        dealer.connect(f"tcp://127.0.0.1:{port}")
        refused = ask(dealer, 7)
        assert refused.header.error_code == errors.NodeNotReadyError.code, refused.body
        assert (refused.header.api_key, refused.header.correlation_id) == (ApiKey.API_VERSIONS, 7)
        assert "is starting" in refused.body["message"]
        assert ask(dealer, 8).header.error_code == errors.NodeNotReadyError.code  # still waiting: each answered
        holder.stop()  # the old session ends: the node registers and its loop serves
        for correlation_id in range(9, 9 + ANSWER_WAIT_MS // RETRY_MS):
            served = ask(dealer, correlation_id)
            if served.header.error_code != errors.NodeNotReadyError.code:
                break
            time.sleep(RETRY_MS / 1000)  # asked before the node saw the old session end
        assert served.header.error_code == 0, served.body
        assert served.body["apis"], served.body
    finally:
        node.stop(drain=False)
        holder.stop()
        holder.close()

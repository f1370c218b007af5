"""Connections keeps replies that arrive while a synchronous request waits, and gives up
on one whose connection dropped (real sockets)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import zmq

from fabric import errors
from fabric.local import LocalCluster, free_port
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from fabric.transport import Connections
from sdk import Admin
from sdk._client import METADATA_CONNECT_MS, METADATA_QUICK_CONNECT_MS, Bootstrap


def test_reply_to_another_request_is_kept_not_dropped() -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"

    def serve() -> None:
        # Receive both requests, then answer in order: the reply to the request already in
        # flight arrives while the caller is inside request() waiting for its own.
        first = router.recv_multipart()
        second = router.recv_multipart()
        for identity, *frames in (first, second):
            header = apis.decode_request(frames).header
            body = {"controller_id": 1, "nodes": [], "topics": []}
            router.send_multipart([identity, *apis.encode_response(header, body)])

    server = threading.Thread(target=serve)
    server.start()
    conns = Connections(ctx)
    try:
        conns.send(address, apis.encode_request(ApiKey.METADATA, {"topics": []}, 41))  # "in flight"
        reply = conns.request(address, ApiKey.METADATA, {"topics": []}, timeout_ms=10_000)
        assert reply.header.correlation_id != 41
        later = conns.poll(1_000)
        assert [apis.decode_response([f.bytes for f in frames]).header.correlation_id for _a, frames in later] == [41]
    finally:
        server.join(timeout=10)
        conns.close()
        router.close(linger=0)


def test_a_request_fails_fast_when_its_connection_drops() -> None:
    """A peer that dies while a request waits: the answer can no longer come, so the
    request fails at once (NodeNotReadyError) instead of waiting out its timeout."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    received = threading.Event()

    def take_and_die() -> None:
        if router.poll(10_000):
            router.recv_multipart()
            received.set()
            router.close(linger=0)  # no answer; the connection goes

    server = threading.Thread(target=take_and_die)
    server.start()
    conns = Connections(ctx)
    try:
        started = time.monotonic()
        with pytest.raises(errors.NodeNotReadyError, match="connection dropped"):
            conns.request(address, ApiKey.METADATA, {"topics": []}, timeout_ms=60_000)
        assert received.is_set()
        assert time.monotonic() - started < 30  # not the 60 s timeout (the drop takes ms)
        assert address not in conns.sockets  # dropped: the next request connects afresh
    finally:
        server.join(timeout=10)
        conns.close()
        if not router.closed:
            router.close(linger=0)


def test_a_node_never_connected_says_nothing_was_sent() -> None:
    conns = Connections(zmq.Context.instance())
    try:
        with pytest.raises(errors.NodeNotReadyError, match="not reachable") as caught:
            conns.request(f"tcp://127.0.0.1:{free_port()}", ApiKey.METADATA, {"topics": []}, wait_connect_ms=50)
        assert caught.value.fields.get("sent") is False
    finally:
        conns.close()


def _recording(admin: Admin) -> list[tuple[str, int]]:
    """Calls of the admin's real Connections.request, as (address, wait_connect_ms)."""
    calls: list[tuple[str, int]] = []
    request = admin._conns.request

    def record(address: str, *args: Any, **kwargs: Any) -> Any:
        calls.append((address, kwargs.get("wait_connect_ms", -1)))
        return request(address, *args, **kwargs)
    admin._conns.request = record  # type: ignore[method-assign]
    return calls


def test_admin_gives_a_dead_node_only_a_short_connect_wait_first(cluster: LocalCluster, topic_name: str) -> None:
    """A node gone from the map's first place costs an admin call the quick pass, not a
    whole connect wait; nodes that could not be reached get the patient pass after all
    others were tried."""
    dead = f"tcp://127.0.0.1:{free_port()}"
    live = Bootstrap(cluster.bootstrap).node_addresses()[0]
    with Admin(f"{dead},{live}") as admin:
        calls = _recording(admin)
        admin.create_topic(topic_name, partitions=1, replication_factor=1)
        assert calls[:2] == [(dead, METADATA_QUICK_CONNECT_MS), (live, METADATA_QUICK_CONNECT_MS)]
    other = f"tcp://127.0.0.1:{free_port()}"
    with Admin(f"{dead},{other}") as admin:
        calls = _recording(admin)
        with pytest.raises(errors.NoBrokersAvailableError):
            admin.delete_topic(topic_name)
        assert calls == [(dead, METADATA_QUICK_CONNECT_MS), (other, METADATA_QUICK_CONNECT_MS),
                         (dead, METADATA_CONNECT_MS), (other, METADATA_CONNECT_MS)]

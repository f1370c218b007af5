"""A node that goes away is noticed from its socket's monitor at once (real ZeroMQ sockets):
producers and consumers then look for a new leader without waiting out a request."""

from __future__ import annotations

import time

import zmq

from sdk._client import DROPPED_SUSPECT_S, Connections, DroppedNodes


def test_a_closed_peer_is_reported_dropped_then_forgotten() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    conns = Connections(ctx, security=None)
    dropped = DroppedNodes()
    try:
        conns.send(address, [b"hello"])  # connects (IMMEDIATE: waits for the handshake)
        assert router.poll(5_000)
        assert dropped.update(conns, time.monotonic()) == {}
        router.close(linger=0)  # the node goes away
        deadline = time.monotonic() + 5.0
        seen: dict[str, float] = {}
        while not seen and time.monotonic() < deadline:
            seen = dict(dropped.update(conns, time.monotonic()))
            time.sleep(0.01)
        assert list(seen) == [address]
        later = seen[address] + DROPPED_SUSPECT_S + 0.1
        assert dropped.update(conns, later) == {}
    finally:
        conns.close()
        ctx.term()

"""The node's client ROUTER holds a bounded number of a client's requests.

Past ``CLIENT_REQUESTS_QUEUED_MAX`` requests read from one connection and not yet taken by
the loop, ZeroMQ stops reading that connection, so a client that sends faster than the
node works meets backpressure instead of growing the node's memory. Checked with real
sockets on loopback: a client sends 1 MiB messages that nobody takes, and counts how
many its socket accepts before it pushes back. The count is the node's queue plus what
the kernel's socket buffers hold (a few MiB), never the 200 MiB sent (with the former
bound of 10,000 messages, all 200 were accepted into the receiving process's memory).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from nodes import server

MESSAGE_BYTES = 1024 * 1024
SENT_MAX = 200
QUIET_S = 1.0  # no send accepted for this long: the client is being pushed back


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_client_router_bounds_what_it_queues_and_answers(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    router = server.client_router(ctx, 0)
    assert router.getsockopt(zmq.RCVHWM) == server.CLIENT_REQUESTS_QUEUED_MAX
    assert router.getsockopt(zmq.SNDHWM) == server.ROUTER_HWM_MESSAGES
    assert router.getsockopt(zmq.MAXMSGSIZE) == server.MESSAGE_BYTES_MAX
    router.close()


def test_a_client_that_outruns_the_node_is_pushed_back(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    router = server.client_router(ctx, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ctx.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.setsockopt(zmq.SNDHWM, 1)
    client.connect(f"tcp://127.0.0.1:{port}")
    client.send(b"hello")  # connected before the flood: a slow connect must not pass for backpressure
    assert router.poll(10_000)
    router.recv_multipart()
    payload = b"x" * MESSAGE_BYTES
    accepted, last_accepted = 0, time.monotonic()
    while accepted < SENT_MAX and time.monotonic() - last_accepted < QUIET_S:
        try:
            client.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            time.sleep(0.005)
            continue
        accepted += 1
        last_accepted = time.monotonic()
    print(f"accepted {accepted} of {SENT_MAX} messages of 1 MiB before backpressure")
    assert 0 < accepted < SENT_MAX // 2  # 15-19 here: 8 queued, the rest in the kernel's buffers
    # Nothing was lost: once the node reads, every accepted message arrives.
    received = 0
    while received < accepted and router.poll(5_000):
        _identity, body = router.recv_multipart()
        assert len(body) == MESSAGE_BYTES
        received += 1
    assert received == accepted
    client.close()
    router.close()

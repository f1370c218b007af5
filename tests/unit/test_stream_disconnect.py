"""A follower must not abort when it stops following a leader whose stream it just polled.

libzmq pre-reads the first frame of a SUB's next message when the socket is polled;
disconnecting that peer before the rest of the message is read aborts the process
(``Assertion failed: !_more (src/fq.cpp:80)``). A node died that way when a peer's
ZooKeeper session expired. The follower defers the disconnect until after its next drain
(``nodes.follower.disconnect_streams``). Run in a child process: an abort there fails this
test instead of killing pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import time
    from types import SimpleNamespace
    import zmq
    from nodes import follower

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(address)
    node = SimpleNamespace(sockets=SimpleNamespace(sub=sub), pkeys={}, followers={},
                           sub_connected={address}, sub_disconnect_pending=set())
    deadline = time.monotonic() + 10
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    while not poller.poll(0):  # the slow-joiner: publish until the subscription is through
        assert time.monotonic() < deadline, "the stream never arrived"
        pub.send_multipart([b"key", b"meta", b"data"])
        time.sleep(0.01)
    for _ in range(10):
        pub.send_multipart([b"key", b"meta", b"data"])
    time.sleep(0.2)
    assert poller.poll(100)  # the poll pre-reads a frame, as the node's loop does
    # What apply_roles does when the leader's process is gone: mark, not disconnect.
    node.sub_connected.discard(address)
    node.sub_disconnect_pending.add(address)
    follower.drain_stream(node)
    assert not node.sub_disconnect_pending
    poller.poll(100)
    print("survived")
""")


def test_disconnecting_a_polled_stream_does_not_abort() -> None:
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert "survived" in child.stdout

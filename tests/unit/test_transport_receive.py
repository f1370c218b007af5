"""ZMQ_EVENTS can say a message waits on a connection whose pipe is then torn down (a node
killed mid-answer), and the receive that follows raises zmq.Again. A consumer's poll once
handed that exception to its caller during a leader kill (a fault test's reader failed
with ``Again('Resource temporarily unavailable')``); now such a receive reads as nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from fabric import transport
from fabric.transport import Connections, recv_if_ready


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://receive-test")
    b.connect("inproc://receive-test")
    try:
        yield a, b
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def test_recv_if_ready_is_none_when_nothing_is_there(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    a, b = pair
    assert recv_if_ready(a) is None
    b.send_multipart([b"h", b"b"])
    assert a.poll(1000)
    frames = recv_if_ready(a)
    assert frames is not None and [f.bytes for f in frames] == [b"h", b"b"]


def test_a_spurious_readable_ends_the_drain(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    b.send_multipart([b"one"])
    assert a.poll(1000)
    monkeypatch.setattr(transport, "readable", lambda sock: True)  # as ZMQ_EVENTS did, once the pipe went
    out: list[tuple[str, list[Any]]] = []
    Connections._receive_all(a, "tcp://node", out)
    assert [(address, [f.bytes for f in frames]) for address, frames in out] == [("tcp://node", [b"one"])]

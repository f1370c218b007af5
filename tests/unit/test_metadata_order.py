"""Which node a client asks for the routing map: the silent ones last (issue 10, failover time).

A killed leader stays in the routing map until its ZooKeeper session expires; a producer
that asked it first for the new map waited on it at every recheck, which added seconds to
a failover. These tests use real ZeroMQ sockets: one address answers nothing.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import zmq

from fabric import errors
from fabric.protocol import apis
from fabric.transport import Connections
from sdk._client import Bootstrap, MetadataClient


class _Asked:
    def __init__(self, inner: Connections) -> None:
        self.inner = inner
        self.asked: list[str] = []

    def request(self, address: str, *args: Any, **kwargs: Any) -> apis.Message:
        self.asked.append(address)
        return self.inner.request(address, *args, **kwargs)


def test_an_address_that_did_not_answer_is_asked_last_and_avoid_comes_last() -> None:
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # accepts the connection, never answers
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    dead, quiet = "tcp://127.0.0.1:1", f"tcp://127.0.0.1:{port}"
    conns = Connections(ctx)
    try:
        asked = _Asked(conns)
        meta = MetadataClient(Bootstrap([dead, quiet]), asked)  # type: ignore[arg-type]
        assert meta.candidates() == [dead, quiet]
        assert meta.candidates(avoid=[dead]) == [quiet, dead]
        with pytest.raises(errors.NoBrokersAvailableError):  # neither answers
            meta.refresh(timeout_ms=100)
        assert asked.asked[:2] == [dead, quiet]
        assert set(meta.candidates()) == {dead, quiet}
        meta._unanswered[quiet] = 0.0  # long ago: forgiven
        assert meta.candidates() == [quiet, dead]
    finally:
        conns.close()
        silent.close(linger=0)


def test_a_refresh_that_asked_nobody_says_why() -> None:
    """Its time gone before any node was asked (a poll's last slice after a ZooKeeper
    pause), the error read "(last error: None)" (a sequencer fault hunt)."""
    conns = Connections(zmq.Context.instance())
    try:
        meta = MetadataClient(Bootstrap(["tcp://127.0.0.1:1"]), conns)
        with pytest.raises(errors.NoBrokersAvailableError, match="time ran out before any node was asked"):
            meta.refresh(timeout_ms=100, deadline_s=time.monotonic() - 1)
    finally:
        conns.close()

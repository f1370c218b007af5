"""QueueConsumer's client loop against a fake node: no cluster needed."""

from __future__ import annotations

import time
from typing import Any

import zmq

from fabric import errors
from fabric.protocol import apis
from sdk.queue import QueueConsumer


class _RefusingConns:
    """Every QUEUE_RECEIVE is answered at once with NOT_LEADER (a leader changing)."""

    def __init__(self) -> None:
        self.sent = 0
        self._ids = 0
        self._replies: list[tuple[str, list[Any]]] = []

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def send(self, address: str, frames: list[Any], *, wait_connect_ms: int = 0) -> None:
        header = apis.decode_request([bytes(f) for f in frames]).header
        self.sent += 1
        self._replies.append((address, [zmq.Frame(f) for f in apis.encode_error_response(
            header, errors.NotLeaderError.code, "not leader")]))

    def poll(self, timeout_ms: int) -> list[tuple[str, list[Any]]]:
        out, self._replies = self._replies, []
        return out

    def drain(self) -> list[tuple[str, list[Any]]]:
        return self.poll(0)

    def take_disconnected(self) -> set[str]:
        return set()

    def drop(self, address: str) -> None:
        pass

    def close(self) -> None:
        pass


class _Partition:
    partition = 0


class _Topic:
    partitions = [_Partition()]


class _Metadata:
    topics = {"jobs": _Topic()}  # the queue is known: every refresh is a retry's

    @staticmethod
    def leader_address(topic: str, partition: int) -> str:
        return "tcp://127.0.0.1:9"


class _Meta:
    metadata = _Metadata()
    refreshes = 0

    def topic(self, name: str, refresh_if_missing: bool = True) -> _Topic:
        return _Topic()

    def refresh(self, topics: list[str] | None = None, deadline_s: float | None = None) -> None:
        self.refreshes += 1


def test_long_poll_refused_at_once_does_not_spin() -> None:
    """A node that refuses at once (NOT_LEADER, NODE_NOT_READY) made receive(wait_ms=...)
    send a request and refresh the metadata in a tight loop for the whole wait: ~20,000
    of each per second. It now pauses RECEIVE_RETRY_S between such rounds."""
    worker = QueueConsumer("tcp://127.0.0.1:1", "jobs")
    conns, meta = _RefusingConns(), _Meta()
    worker._conns, worker._meta = conns, meta  # type: ignore[assignment]
    started = time.monotonic()
    assert worker.receive(1, 500) == []
    assert time.monotonic() - started >= 0.45  # the wait is kept
    assert conns.sent <= 10 and meta.refreshes <= 10
    worker.close()


def test_bad_group_and_consumer_ids_fail_at_construction() -> None:
    """group="" (or over 255 bytes) was accepted, and failed only at the first receive."""
    import pytest

    for kwargs in ({"group": ""}, {"group": "g" * 256}, {"consumer_id": "c" * 256}):
        with pytest.raises(errors.InvalidRequestError, match=r"1\.\.255 bytes"):
            QueueConsumer("tcp://127.0.0.1:1", "jobs", **kwargs)  # type: ignore[arg-type]
    QueueConsumer("tcp://127.0.0.1:1", "jobs", "g" * 255, consumer_id="").close()  # "" : a generated id


def test_describe_queue_refuses_the_every_group_query() -> None:
    """describe_queue(name, "") returned every group's rows in one description, whose
    total() added the groups up."""
    import pytest

    from sdk import Admin

    with Admin("tcp://127.0.0.1:1") as admin, pytest.raises(errors.InvalidRequestError, match="describe_queue_groups"):
        admin.describe_queue("jobs", "")

"""QueueConsumer's client loop against a fake node: no cluster needed."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import zmq

from fabric import errors
from fabric.protocol import apis
from sdk.queue import QueueConsumer, QueueMessage


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


NODE = "tcp://127.0.0.1:9"


class _LeasingConns(_RefusingConns):
    """A node whose wall clock is ``skew_ms`` off this process's: each QUEUE_RECEIVE gets
    one message leased for 30 s by that clock. ``speaks_v1`` False: an older node, which
    answers version 1 with UNSUPPORTED_VERSION."""

    def __init__(self, skew_ms: int, speaks_v1: bool = True, lease_ms: int = 30_000) -> None:
        super().__init__()
        self.skew_ms = skew_ms
        self.speaks_v1 = speaks_v1
        self.lease_ms = lease_ms
        self.versions: list[int] = []

    def send(self, address: str, frames: list[Any], *, wait_connect_ms: int = 0) -> None:
        header = apis.decode_request([bytes(f) for f in frames]).header
        self.versions.append(header.api_version)
        if header.api_version and not self.speaks_v1:
            reply = apis.encode_error_response(header, errors.UnsupportedVersionError.code, "version 1")
        else:
            now_ms = int(time.time() * 1000) + self.skew_ms
            message = {"partition": 0, "offset": len(self.versions), "delivery_count": 1, "deadline_ms": now_ms + self.lease_ms,
                       "timestamp_ms": now_ms, "priority": 4, "key": None, "value": b"job", "headers": []}
            reply = apis.encode_response(header, {"error": 0, "message": "", "messages": [message], "now_ms": now_ms})
        self._replies.append((address, [zmq.Frame(f) for f in reply]))


class _Led:
    partition, leader, leader_epoch = 0, 1, 0


class _LedTopic:
    partitions = [_Led()]


class _LedMetadata:
    topics = {"jobs": _LedTopic()}
    nodes = {1: NODE}

    @staticmethod
    def leader_address(topic: str, partition: int) -> str:
        return NODE


class _LedMeta(_Meta):
    metadata = _LedMetadata()  # type: ignore[assignment]

    def topic(self, name: str, refresh_if_missing: bool = True) -> _LedTopic:  # type: ignore[override]
        return _LedTopic()


def _worker(conns: _LeasingConns) -> QueueConsumer:
    worker = QueueConsumer("tcp://127.0.0.1:1", "jobs")
    worker._conns, worker._meta = conns, _LedMeta()  # type: ignore[assignment]
    return worker


def test_a_worker_whose_clock_is_ahead_keeps_its_leases() -> None:
    """The SDK compared the node's ``deadline_ms`` with this host's wall clock: a worker an
    hour ahead of the nodes took every 30 s lease as over on arrival and handed nothing
    out (each message, counted as delivered, went on to the dead-letter queue unseen). It
    now reads the deadline against the node's clock as the answer left (version 1)."""
    conns = _LeasingConns(skew_ms=-3_600_000)
    worker = _worker(conns)
    got = worker.receive(1, 500)
    assert [m.value for m in got] == [b"job"] and conns.versions == [1]
    assert 29.0 < got[0].lease_ends_s - time.monotonic() <= 30.0  # the node's 30 s, on our clock
    worker.close()


def test_an_older_node_is_asked_with_version_0() -> None:
    """A node that does not speak QUEUE_RECEIVE version 1 answers UNSUPPORTED_VERSION: asked
    again with version 0, whose deadlines are read against this host's clock, as before."""
    conns = _LeasingConns(skew_ms=0, speaks_v1=False)
    worker = _worker(conns)
    assert [m.value for m in worker.receive(1, 500)] == [b"job"]
    assert conns.versions == [1, 0]
    worker.receive(1, 500)
    assert conns.versions == [1, 0, 0]  # remembered
    worker.close()


def test_a_node_restarted_after_refusing_version_1_is_asked_with_version_1_again() -> None:
    """A rolling upgrade restarts each node on the new release: the consumer, which had
    fallen back to version 0 for every node while they were old, kept version 0 for them
    after they were upgraded, so its leases were judged on this host's clock for good.
    A dropped connection (the restart) now forgets the fallback for that node."""
    conns = _LeasingConns(skew_ms=0, speaks_v1=False)
    worker = _worker(conns)
    worker.receive(1, 500)
    assert conns.versions == [1, 0]
    conns.speaks_v1 = True  # upgraded and restarted: the connection dropped
    conns.take_disconnected = lambda: {NODE}  # type: ignore[method-assign]
    worker._take_replies(0)
    conns.take_disconnected = set  # type: ignore[method-assign,assignment]
    worker.receive(1, 500)
    assert conns.versions[2:] == [1]
    worker.close()


def test_an_answer_read_late_counts_its_lease_from_when_it_could_have_left() -> None:
    """An answer that waited unread (the worker was busy with other messages) is judged
    from the last time the consumer looked, not from when it is read: its lease may be
    over, and another worker may have the message by then."""
    conns = _LeasingConns(skew_ms=-3_600_000, lease_ms=200)
    worker = _worker(conns)
    worker._send_polls(1, 0)
    time.sleep(0.3)  # busy: the answer waits unread past its lease
    assert [m.offset for m in worker.receive(1, 0)] == [2]  # not 1, the one that waited; 2 is a new poll's
    worker.close()



class _StoppedInPollConns(_LeasingConns):
    """The first answer arrives while this process is stopped in poll() (SIGSTOP, a
    stalled VM) for longer than its lease: poll() returns it only when the process runs
    again. Nothing is waiting when the consumer drains first."""

    def __init__(self, lease_ms: int, stopped_s: float) -> None:
        super().__init__(skew_ms=-3_600_000, lease_ms=lease_ms)
        self.stopped_s = stopped_s

    def drain(self) -> list[tuple[str, list[Any]]]:
        return []

    def poll(self, timeout_ms: int) -> list[tuple[str, list[Any]]]:
        if self.stopped_s:
            time.sleep(self.stopped_s)
            self.stopped_s = 0.0
        return super().poll(timeout_ms)


def test_an_answer_read_after_the_process_was_stopped_in_poll_counts_from_the_poll() -> None:
    """An answer poll() returned was taken to have left the node just then: a worker
    SIGSTOPped in that poll past the lease handed the message out when it woke, after
    another worker had been given it and had acked it (an async fault hunt: two messages
    handled twice). Its lease now counts from when the poll began, at the latest."""
    conns = _StoppedInPollConns(lease_ms=200, stopped_s=0.3)
    worker = _worker(conns)
    assert [m.offset for m in worker.receive(1, 2_000)] == [2]  # not 1, whose lease ended in the stop
    worker.close()

def test_calls_after_close_raise_client_closed() -> None:
    """A closed QueueConsumer raised InvalidRequestError, which reads as a request the nodes
    refused; every other client (and the asyncio QueueConsumer) raises ClientClosedError."""
    worker = QueueConsumer("tcp://127.0.0.1:1", "jobs")
    worker.close()
    worker.close()  # idempotent
    for call in (lambda: worker.receive(1, 0), lambda: worker.ack([]), lambda: worker.nack([])):
        try:
            call()
        except errors.ClientClosedError:
            continue
        raise AssertionError("a call after close() did not raise ClientClosedError")


class _SettlingConns(_RefusingConns):
    """QUEUE_SETTLE as a leader that is there but out of reach (paused: no connection can
    be made, so nothing is sent), or as one that answers that the lease had ended."""

    def __init__(self, reachable: bool) -> None:
        super().__init__()
        self.reachable = reachable

    def request(self, address: str, api: Any, body: dict[str, Any], *, timeout_ms: int) -> Any:
        if not self.reachable:
            raise errors.NodeNotReadyError(f"node {address} is not reachable", sent=False)
        results = [{"partition": e["partition"], "offset": e["offset"], "deadline_ms": 0,
                    "error": errors.LeaseNotHeldError.code} for e in body["entries"]]
        return SimpleNamespace(body={"error": 0, "message": "", "results": results})


def _leased(offset: int) -> QueueMessage:
    now_ms = int(time.time() * 1000)
    return QueueMessage("jobs", 0, offset, 1, now_ms + 30_000, now_ms, 4, None, b"job", granted_by=NODE)


def test_an_ack_that_never_left_does_not_say_the_lease_ended() -> None:
    """An ack whose request could not be sent (its leader paused: no connection) raised
    LeaseNotHeldError saying the lease had ended and the messages were delivered again;
    the lease is live on that leader, and they come back only when it ends (visibility
    timeout, or the leader's failover). A lease the leader says had ended still says so."""
    import pytest

    worker = QueueConsumer("tcp://127.0.0.1:1", "jobs")
    worker._meta = _LedMeta()  # type: ignore[assignment]
    worker._conns = _SettlingConns(reachable=False)  # type: ignore[assignment]
    with pytest.raises(errors.LeaseNotHeldError) as raised:
        worker.ack([_leased(1), _leased(2)])
    text = raised.value.message
    assert "had ended" not in text and "had lost" not in text, text
    assert "2 were not sent" in text and "once their lease ends" in text and "visibility timeout" in text, text
    assert [m.offset for m in raised.value.lost] == [1, 2] and raised.value.unknown == []

    worker._conns = _SettlingConns(reachable=True)  # type: ignore[assignment]
    with pytest.raises(errors.LeaseNotHeldError) as raised:
        worker.nack([_leased(3)])
    text = raised.value.message
    assert "1 had lost their lease" in text and "not sent" not in text, text
    worker._conns = _RefusingConns()  # type: ignore[assignment]
    worker.close()

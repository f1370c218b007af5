"""The asyncio clients' hand-offs between the event loop and their worker threads, where
a cancellation or a closing loop lands in the middle: no cluster needed (real ZeroMQ
sockets, a real event loop)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from typing import Any

import pytest
import zmq

import sdk
import sdk.aio
from fabric import errors
from sdk._client import TopicPartition
from sdk.accumulator import BatchResult, RecordFuture
from sdk.aio import AsyncConsumer, AsyncProducer
from sdk.aio_queue import AsyncQueueConsumer
from sdk.consumer import Consumer, HandOut, Record

NOWHERE = "tcp://127.0.0.1:1"  # nothing listens: nothing in these tests asks a node anything
BUILD_WAIT_S = 5.0  # how long a consumer being built waits for the test to let it finish
SETTLE_TIMEOUT_S = 5.0  # for the worker thread to run the queued close and end
WORKER_PREFIX = "fabric-aio-consumer"


def _workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(WORKER_PREFIX)]


def test_a_consumer_whose_creation_was_cancelled_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``asyncio.wait_for(client.consumer(...), tiny)`` cancelled the creation while the
    Consumer was being built on its worker: the worker went on building it, and nobody
    closed it (its sockets stayed open for as long as anything held it). It is now closed
    on its worker as soon as it exists."""
    made: list[Consumer] = []
    sockets: list[zmq.Socket[Any]] = []
    release = threading.Event()

    class SlowConsumer(Consumer):
        """A real Consumer that holds a real socket (as one does once it has asked a node)
        and is still being built when the creation is cancelled."""

        def __init__(self, bootstrap: str, **config: Any) -> None:
            super().__init__(bootstrap, **config)
            sockets.append(self._conns.socket(NOWHERE))
            made.append(self)
            release.wait(BUILD_WAIT_S)

    monkeypatch.setattr(sdk.aio, "Consumer", SlowConsumer)

    async def cancel_the_creation() -> None:
        client = await sdk.connect(NOWHERE)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.consumer(), 0.05)
        release.set()  # now it is made, after its creation was given up
        await client.close()

    assert not _workers()
    asyncio.run(cancel_the_creation())
    deadline_s = time.monotonic() + SETTLE_TIMEOUT_S
    while (_workers() or not made or not made[0]._closed) and time.monotonic() < deadline_s:
        time.sleep(0.01)
    assert len(made) == 1 and made[0]._closed, "the consumer of a cancelled creation was never closed"
    assert all(sock.closed for sock in sockets) and not made[0]._conns.sockets
    assert not _workers(), f"worker threads left: {_workers()}"


class _OneSend:
    """A Producer as AsyncProducer uses it: ``send`` returns the future the sender thread
    settles (a real RecordFuture over a real BatchResult)."""

    closed = False

    def __init__(self, batch: BatchResult) -> None:
        self.batch = batch

    def send(self, *args: Any, **kwargs: Any) -> RecordFuture:
        return RecordFuture(self.batch, 0, 0)


def test_an_acknowledgement_after_the_loop_closed_is_dropped(caplog: pytest.LogCaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The send callback checked ``loop.is_closed()``, then called
    ``loop.call_soon_threadsafe``: a loop closed between the two made the call raise
    RuntimeError on the producer's sender thread (logged as a send callback that raised,
    once per record). The loop closing right after the check is reproduced by a closed
    loop whose ``is_closed()`` still says open."""
    batch = BatchResult("events", 0)
    loop = asyncio.new_event_loop()

    async def send() -> asyncio.Future[Any]:
        return AsyncProducer(_OneSend(batch)).send("events", b"v")  # type: ignore[arg-type]

    future = loop.run_until_complete(send())
    loop.close()
    monkeypatch.setattr(loop, "is_closed", lambda: False)  # as it was at the check
    with caplog.at_level(logging.ERROR):
        batch.complete(7)  # what the sender thread does with the acknowledgement
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert not future.done()  # nobody is left to await it


def test_an_acknowledgement_after_the_loop_closed_is_dropped_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """The plain case: the loop closed before the acknowledgement came."""
    batch = BatchResult("events", 0)
    loop = asyncio.new_event_loop()

    async def send() -> asyncio.Future[Any]:
        return AsyncProducer(_OneSend(batch)).send("events", b"v")  # type: ignore[arg-type]

    loop.run_until_complete(send())
    loop.close()
    with caplog.at_level(logging.ERROR):
        batch.complete(7)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_producer_asked_for_off_the_loop_is_refused_before_it_is_made() -> None:
    """``client.producer()`` from a thread without a running loop made a Producer (its
    sender thread, its sockets) and only then found no loop to hand its results to: the
    Producer was left running. It is now refused first, with nothing made."""

    async def ask_off_the_loop() -> list[str]:
        client = await sdk.connect(NOWHERE)
        try:
            with pytest.raises(RuntimeError, match="no running event loop"):
                await asyncio.to_thread(client.producer)
            assert not client._producers
            return [t.name for t in threading.enumerate() if t.name == "fabric-producer-sender"]
        finally:
            await client.close()

    assert not asyncio.run(ask_off_the_loop()), "a producer was made, and left running, for a refused call"


def test_a_registry_change_after_the_loop_closed_is_dropped() -> None:
    """A direct-plane registry watch fires on kazoo's thread and hands the change to the
    client's loop; an application that ended without ``close()`` has closed that loop, and
    ``call_soon_threadsafe`` raised RuntimeError on kazoo's thread (logged with a traceback
    by kazoo). The change is dropped: nobody is left to use it."""
    from sdk.direct._types import to_loop

    loop = asyncio.new_event_loop()
    seen: list[object] = []
    to_loop(loop, seen.append, 1)
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    to_loop(loop, seen.append, 2)  # raised RuntimeError before
    assert seen == [1]


class _Closes:
    """What AsyncClient.close() closes (a producer, consumer or queue consumer), by name."""

    def __init__(self, name: str, closed: list[str], fails: bool = False) -> None:
        self.name = name
        self._closed_names = closed
        self.fails = fails

    async def close(self) -> None:
        self._closed_names.append(self.name)
        if self.fails:
            raise RuntimeError(f"{self.name}: on_partitions_revoked raised")


def test_client_close_closes_everything_when_one_close_raises() -> None:
    """A consumer's close() raises what its rebalance listener's on_partitions_revoked
    raised (docs/DIRECT.md); ``client.close()`` passed that on at once, and the consumers
    after it and every queue consumer were never closed (their worker threads and sockets
    left behind, their groups' partitions held until the session ran out). Everything is
    closed now, then the first error is raised."""
    closed: list[str] = []

    async def close_all() -> None:
        client = await sdk.connect(NOWHERE)
        client._producers["p"] = _Closes("producer", closed)  # type: ignore[assignment]
        client._consumers += [_Closes("hook raises", closed, fails=True), _Closes("consumer", closed)]  # type: ignore[list-item]
        client._queue_consumers.append(_Closes("queue consumer", closed))  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="hook raises"):
            await client.close()

    asyncio.run(close_all())
    assert closed == ["producer", "hook raises", "consumer", "queue consumer"]


class _HeldUpConsumer:
    """A group member as ``async for`` uses it: one poll's two records of one partition; a
    heartbeat is due before the first, and the event loop was held up (another task's
    blocking code) while that heartbeat ran on the worker, past the member's session, so
    the record reaches the loop only after the coordinator may have given the partition
    away. The next ``between_records()`` drops the partition (the session clock)."""

    def __init__(self) -> None:
        self.tp = TopicPartition("events", 0)
        self._positions = {self.tp: 2}
        self._paused: set[TopicPartition] = set()
        self._iteration: object = None
        self._closed = False
        self.heartbeat_due = True
        self.session_over = False
        self.between_calls = 0
        self.polls = 0

    def poll_for_hand_out(self, timeout_ms: int) -> HandOut:
        self.polls += 1
        if self.polls > 1:
            time.sleep(timeout_ms / 1000)
            return HandOut(self, [])  # type: ignore[arg-type]
        return HandOut(self, [Record("events", 0, offset, 0, None, b"v", []) for offset in (0, 1)])  # type: ignore[arg-type]

    def between_records_due(self) -> bool:
        return self.heartbeat_due or (self.session_over and self.tp in self._positions)

    def between_records(self) -> None:
        self.between_calls += 1
        if self.session_over:
            self._positions.pop(self.tp, None)  # lost: the session clock ran out
        self.heartbeat_due = False
        self.session_over = True  # the loop is held up as this returns

    def close(self) -> None:
        self._closed = True


def test_async_for_checks_the_session_clock_again_after_a_held_up_loop() -> None:
    """``async for`` ran ``between_records()`` (heartbeat, session clock) on the worker
    and then handed out the record without looking again: a loop held up meanwhile by
    another task handed out a record of a partition the coordinator had given to another
    member (two members handling it at once, docs/GROUPS.md)."""
    fake = _HeldUpConsumer()

    async def first_record() -> Record | None:
        consumer = AsyncConsumer(concurrent.futures.ThreadPoolExecutor(1), fake, 20)  # type: ignore[arg-type]
        try:
            return await asyncio.wait_for(consumer.__aiter__().__anext__(), 0.5)
        except asyncio.TimeoutError:
            return None
        finally:
            await consumer.close()

    assert asyncio.run(first_record()) is None, "a record of a partition lost meanwhile was handed out"
    assert fake.between_calls == 2


class _StuckFlushProducer:
    """A Producer as AsyncProducer uses it, whose flush() waits until close() (as one does
    while no node answers, until the records' delivery timeout)."""

    closed = False

    def __init__(self) -> None:
        self.closing = threading.Event()

    def flush(self, timeout: float | None = None) -> None:
        self.closing.wait(60)

    def close(self, timeout: float | None = None) -> None:
        self.closing.set()


def test_flushes_cut_short_do_not_hold_the_loops_default_executor() -> None:
    """``flush()`` ran on the loop's default executor: flushes cut short by ``wait_for``
    while no node answered kept its few threads until their records failed (2 min by
    default), and ``close(timeout_s=2)``, which runs there too, waited as long (a real
    cluster paused: 8 cut flushes, then close(2) took 30 s with a 30 s delivery timeout),
    as did every other ``asyncio.to_thread`` of the process. A flush now has a thread of
    its own, as its docstring says."""
    producer = _StuckFlushProducer()

    async def cut_then_close() -> None:
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(2))
        aio_producer = AsyncProducer(producer)  # type: ignore[arg-type]
        for _ in range(3):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(aio_producer.flush(), 0.05)
        try:
            # Before, it never started: both default threads waited in cut flushes for it.
            await asyncio.wait_for(aio_producer.close(), BUILD_WAIT_S)
        finally:
            producer.closing.set()

    asyncio.run(cut_then_close())
    assert producer.closing.is_set()


class _QueueConsumerStub:
    """What AsyncQueueConsumer's close() touches of a QueueConsumer."""

    def __init__(self) -> None:
        self._buffer: deque[object] = deque()
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_closed_async_queue_consumer_leaves_no_worker_thread() -> None:
    """``close()`` only asked its worker threads to stop (``shutdown(wait=False)``), so
    they were still alive when it, and ``client.close()``, returned. Both closes have run
    by then and nothing can be queued behind them: the threads are joined now, as
    AsyncConsumer.close() joins its worker."""
    stub = _QueueConsumerStub()

    async def close_it() -> list[str]:
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fabric-aio-queue")
        consumer = AsyncQueueConsumer(worker, stub)  # type: ignore[arg-type]
        await asyncio.get_running_loop().run_in_executor(worker, lambda: None)  # the worker thread runs
        await consumer.close()
        return [t.name for t in threading.enumerate() if t.name.startswith("fabric-aio-queue")]

    assert asyncio.run(close_it()) == [] and stub.closed


class _SlowReceiveStub(_QueueConsumerStub):
    """A QueueConsumer whose receive waits until the test lets it end (a long poll)."""

    def __init__(self) -> None:
        super().__init__()
        self.receives = 0
        self.started = threading.Event()
        self.release = threading.Event()

    def receive(self, max_messages: int = 10, wait_ms: int = 0) -> list[object]:
        self.receives += 1
        self.started.set()
        self.release.wait(BUILD_WAIT_S)
        return []


def test_close_does_not_wait_for_receives_queued_behind_the_running_one() -> None:
    """Tasks sharing one AsyncQueueConsumer (docs/QUEUES.md) queue their receives on its
    worker; ``close()``, queued behind all of them, waited for every one's long poll in
    turn (three tasks iterating: 3 s, not ITERATION_WAIT_MS). Those not yet started are
    now skipped: only the running one is waited for, the others raise ClientClosedError."""
    stub = _SlowReceiveStub()

    async def close_under_receives() -> list[object]:
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fabric-aio-queue")
        consumer = AsyncQueueConsumer(worker, stub)  # type: ignore[arg-type]
        receives = [asyncio.create_task(consumer.receive(10, 1_000)) for _ in range(3)]
        await asyncio.to_thread(stub.started.wait, BUILD_WAIT_S)
        closing = asyncio.create_task(consumer.close())
        await asyncio.sleep(0)  # close() has marked the consumer closing
        stub.release.set()  # the running long poll ends
        await closing
        return await asyncio.gather(*receives, return_exceptions=True)

    outcomes = asyncio.run(close_under_receives())
    assert stub.receives == 1, f"{stub.receives} long polls ran after close() was called"
    assert all(isinstance(o, errors.ClientClosedError) for o in outcomes), outcomes

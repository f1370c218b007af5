"""The asyncio clients' hand-offs between the event loop and their worker threads, where
a cancellation or a closing loop lands in the middle: no cluster needed (real ZeroMQ
sockets, a real event loop)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import zmq

import sdk
import sdk.aio
from sdk.accumulator import BatchResult, RecordFuture
from sdk.aio import AsyncProducer
from sdk.consumer import Consumer

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

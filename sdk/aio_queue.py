"""``AsyncQueueConsumer``: queue mode for asyncio services (``await client.queue_consumer(...)``).

The threaded ``QueueConsumer`` is not thread-safe (its ZeroMQ sockets never change
threads), so it runs on one worker thread of its own, and each receive is awaited there:
the event loop never blocks. Settling (ack, nack, extend) runs on a second worker with a
second ``QueueConsumer`` under the same consumer id (leases belong to the consumer id,
not to a socket): an ack must not wait behind a long poll of up to 20 s on the receiving
worker, or its lease would run out meanwhile and the message be delivered again.

``close()`` may come from another task while ``async for`` or ``receive`` waits: it marks
the consumer closing at once (later calls raise ``ClientClosedError``, the iteration ends
quietly) and then closes the threaded consumer on the worker. A receive already running
there ends at its next slice (about CLOSE_CHECK_INTERVAL_MS, as for a threaded close()
from another thread) with ``ClientClosedError``, and receives of other tasks queued behind
it do not run (they raise it too); what was received and not handed out is given back by
the close.
Iteration takes messages from the buffer one at a time, so what was received but not yet
handed out is given back by that close, not left to its lease. Messages taken on the
worker that no caller will see (the awaiting task was cancelled, as ``asyncio.wait_for``
does, or close() came first) go back to the buffer too: the next receive or iteration
hands them out, or close() gives them back. Any number of tasks may iterate or receive
at once; each message goes to one of them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

from fabric import errors
from fabric.protocol import queues as qp
from sdk._client import Bootstrap
from sdk.queue import QueueConsumer, QueueMessage

T = TypeVar("T")
ITERATION_WAIT_MS = 1_000  # each long poll of ``async for``: how long a close() from another task may wait


class AsyncQueueConsumer:
    """``async for msg in consumer`` long-polls for ever; ``await receive/ack/nack/extend``."""

    def __init__(self, worker: concurrent.futures.ThreadPoolExecutor, consumer: QueueConsumer,
                 make_settler: Callable[[], QueueConsumer] | None = None) -> None:
        self._worker = worker
        self.consumer = consumer
        self._closing = False  # set first by close(); later calls are refused
        self._make_settler = make_settler
        self._settle_worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._settler: QueueConsumer | None = None  # made on the settling worker, on first use
        self._settle_lock = threading.Lock()
        self._lock = threading.Lock()  # the three below, shared by the worker and the loop
        self._unclaimed: dict[int, list[QueueMessage]] = {}
        self._abandoned: set[int] = set()
        self._stranded: list[QueueMessage] = []
        self._call_ids = itertools.count()

    @property
    def closed(self) -> bool:
        """close() was called (later calls are refused)."""
        return self._closing

    @classmethod
    async def create(cls, bootstrap: str | None, queue: str, group: str = qp.DEFAULT_GROUP,
                     **options: Any) -> AsyncQueueConsumer:
        """A QueueConsumer made on its own worker thread; the arguments are QueueConsumer's
        (``bootstrap`` None: ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded)."""
        if bootstrap is None:
            # Found once, here: the settling consumer made later must reach the same cluster.
            bootstrap = Bootstrap(None).text
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fabric-aio-queue")
        future = worker.submit(lambda: QueueConsumer(bootstrap, queue, group, **options))
        try:
            consumer = await asyncio.wrap_future(future)
        except BaseException:
            # Cancelled while it was being made (asyncio.wait_for): close it once it exists.
            future.add_done_callback(_close_when_made)
            worker.shutdown(wait=False)
            raise

        def make_settler() -> QueueConsumer:
            settle_options = {k: v for k, v in options.items() if k != "consumer_id"}
            return QueueConsumer(bootstrap, queue, group, consumer_id=consumer.consumer_id, **settle_options)

        return cls(worker, consumer, make_settler)

    # -- calls on the receiving worker -------------------------------------------------------
    # What a call takes on the worker is handed to its caller through ``_unclaimed`` (call
    # id -> messages), under ``_lock``. Messages no caller will see go back to the buffer:
    # a caller cancelled while its call ran marks it abandoned (the worker puts them back
    # when it ends); one cancelled after its call ended leaves them stranded (the worker's
    # next job, or close(), puts them back); close() gives back everything unclaimed.

    async def _receive_call(self, fn: Callable[[QueueConsumer], list[QueueMessage]]) -> list[QueueMessage]:
        if self._closing:
            raise errors.ClientClosedError("queue consumer is closed")
        call = next(self._call_ids)

        def on_worker(consumer: QueueConsumer) -> None:
            if self._closing:
                # Queued behind another receive when close() came: nothing is taken, and
                # close() (queued behind us) waits for one long poll at most, not one per
                # task sharing this consumer. The caller gets ClientClosedError.
                with self._lock:
                    self._abandoned.discard(call)
                return
            self._reclaim(consumer)
            got = fn(consumer)
            with self._lock:
                if self._closing or call in self._abandoned:
                    self._abandoned.discard(call)
                    consumer._buffer.extendleft(reversed(got))  # close(), queued behind us, gives them back
                elif got:
                    self._unclaimed[call] = got

        future = self._worker.submit(on_worker, self.consumer)
        try:
            await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.cancelled():  # it ran or runs: what it takes must not be stranded
                with self._lock:
                    got = self._unclaimed.pop(call, None)
                    if got is not None:
                        self._stranded.extend(got)
                    elif not future.done():
                        self._abandoned.add(call)
            raise
        with self._lock:
            got = self._unclaimed.pop(call, [])
        if not got and self._closing:
            raise errors.ClientClosedError("queue consumer closed during the receive")
        return got

    def _reclaim(self, consumer: QueueConsumer, *, unclaimed_too: bool = False) -> None:
        """On the worker: stranded messages (and, closing, every unclaimed one) back to the
        front of the buffer, for the next call or for close() to give back."""
        with self._lock:
            back, self._stranded = self._stranded, []
            if unclaimed_too:
                for got in self._unclaimed.values():
                    back.extend(got)
                self._unclaimed.clear()
        consumer._buffer.extendleft(reversed(back))

    async def receive(self, max_messages: int = 10, wait_ms: int = 0) -> list[QueueMessage]:
        return await self._receive_call(lambda c: c.receive(max_messages, wait_ms))

    def __aiter__(self) -> AsyncIterator[QueueMessage]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[QueueMessage]:
        while not self._closing:
            try:
                # Short polls, so that a close() from another task waits at most this long.
                got = await self._receive_call(_next_message)
            except errors.ClientClosedError:
                return
            if got:
                yield got[0]

    # -- settling, on its own worker ---------------------------------------------------------
    async def _settle_call(self, fn: Callable[[QueueConsumer], T]) -> T:
        if self._closing:
            raise errors.ClientClosedError("queue consumer is closed")
        if self._make_settler is None:  # made directly, not by create(): settle where we receive
            return await asyncio.get_running_loop().run_in_executor(self._worker, fn, self.consumer)
        with self._settle_lock:
            if self._settle_worker is None:
                self._settle_worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fabric-aio-settle")
            worker = self._settle_worker
        return await asyncio.get_running_loop().run_in_executor(worker, self._on_settler, fn)

    def _on_settler(self, fn: Callable[[QueueConsumer], T]) -> T:
        if self._settler is None:
            assert self._make_settler is not None
            self._settler = self._make_settler()
        return fn(self._settler)

    async def ack(self, messages: QueueMessage | Iterable[QueueMessage]) -> None:
        await self._settle_call(lambda c: c.ack(messages))

    async def nack(self, messages: QueueMessage | Iterable[QueueMessage], delay_ms: int = 0, reason: str = "") -> None:
        await self._settle_call(lambda c: c.nack(messages, delay_ms, reason))

    async def extend(self, message: QueueMessage, ms: int) -> int:
        return await self._settle_call(lambda c: c.extend(message, ms))

    # -- closing -----------------------------------------------------------------------------
    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        # A receive already running on the worker ends at its next slice (as a threaded
        # close() from another thread ends it), raising ClientClosedError to its task; what
        # it had buffered is given back by the close below. Without this the close waited
        # out the receive's whole wait_ms (up to 20 s).
        self.consumer._close_requested = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._worker, self._close_on_worker)
            with self._settle_lock:
                settle_worker = self._settle_worker
            if settle_worker is not None:
                await loop.run_in_executor(settle_worker, self._close_settler)
        except BaseException:
            # Cancelled (asyncio.wait_for): the closes go on on the workers; waiting for
            # them here would block the event loop until they end.
            self._worker.shutdown(wait=False)
            if self._settle_worker is not None:
                self._settle_worker.shutdown(wait=False)
            raise
        # Both closes ran and nothing can be queued behind them (every call checks
        # ``_closing`` first): the workers are idle, so this is quick, and no thread of this
        # consumer is left once close() returns (as AsyncConsumer.close(); they used to be
        # still running, ending, when client.close() returned).
        self._worker.shutdown(wait=True)
        if self._settle_worker is not None:
            self._settle_worker.shutdown(wait=True)

    def _close_on_worker(self) -> None:
        self._reclaim(self.consumer, unclaimed_too=True)
        self.consumer.close()  # gives back what was received and not handed out

    def _close_settler(self) -> None:
        if self._settler is not None:
            self._settler.close()

    async def __aenter__(self) -> AsyncQueueConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _next_message(consumer: QueueConsumer) -> list[QueueMessage]:
    """On the receiving worker: the next message, as a list of at most one."""
    msg = consumer.next_message(ITERATION_WAIT_MS)
    return [] if msg is None else [msg]


def _close_when_made(future: concurrent.futures.Future[QueueConsumer]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()

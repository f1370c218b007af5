"""``AsyncQueueConsumer``: queue mode for asyncio services (``await client.queue_consumer(...)``).

The threaded ``QueueConsumer`` runs on one worker thread of its own (its ZeroMQ sockets
never change threads); each call is awaited there, so the event loop never blocks.

``close()`` may come from another task while ``async for`` waits: it marks the consumer
closing at once (later calls raise ``ClientClosedError``, the iteration ends quietly) and
then closes the threaded consumer on the worker, after any receive already running there.
Iteration takes messages from the threaded consumer's buffer one at a time, so what was
received but not yet handed out is given back by that close, not left to its lease. A
message taken from the buffer that the iteration could not hand out (close() came first,
or the awaiting task was cancelled, as ``asyncio.wait_for`` does) is kept: the next
iteration hands it out, or close() gives it back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

from fabric import errors
from fabric.protocol import queues as qp
from sdk.queue import QueueConsumer, QueueMessage

T = TypeVar("T")
ITERATION_WAIT_MS = 1_000  # each long poll of ``async for``: how long a close() from another task may wait


class AsyncQueueConsumer:
    """``async for msg in consumer`` long-polls for ever; ``await receive/ack/nack/extend``."""

    def __init__(self, worker: concurrent.futures.ThreadPoolExecutor, consumer: QueueConsumer) -> None:
        self._worker = worker
        self.consumer = consumer
        self._closing = False  # set first by close(); later calls are refused
        # Taken from the consumer's buffer on the worker but not yet handed out by the loop:
        # written and read on the worker; the loop clears it only as it hands the message out.
        self._in_transit: QueueMessage | None = None

    @classmethod
    async def create(cls, bootstrap: str, queue: str, group: str = qp.DEFAULT_GROUP, **options: Any) -> AsyncQueueConsumer:
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fabric-aio-queue")
        try:
            consumer = await asyncio.get_running_loop().run_in_executor(
                worker, lambda: QueueConsumer(bootstrap, queue, group, **options))
        except BaseException:
            worker.shutdown(wait=False)
            raise
        return cls(worker, consumer)

    async def _call(self, fn: Callable[[QueueConsumer], T]) -> T:
        if self._closing:
            raise errors.ClientClosedError("queue consumer is closed")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, self.consumer)

    async def receive(self, max_messages: int = 10, wait_ms: int = 0) -> list[QueueMessage]:
        return await self._call(lambda c: c.receive(max_messages, wait_ms))

    async def ack(self, messages: QueueMessage | Iterable[QueueMessage]) -> None:
        await self._call(lambda c: c.ack(messages))

    async def nack(self, messages: QueueMessage | Iterable[QueueMessage], delay_ms: int = 0, reason: str = "") -> None:
        await self._call(lambda c: c.nack(messages, delay_ms, reason))

    async def extend(self, message: QueueMessage, ms: int) -> int:
        return await self._call(lambda c: c.extend(message, ms))

    def __aiter__(self) -> AsyncIterator[QueueMessage]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[QueueMessage]:
        while not self._closing:
            try:
                # Short polls, so that a close() from another task waits at most this long.
                msg = await self._call(self._next)
            except errors.ClientClosedError:
                return
            if msg is not None and not self._closing:
                self._in_transit = None  # handed out: the application's now
                yield msg

    def _next(self, consumer: QueueConsumer) -> QueueMessage | None:
        """On the worker: the message a cancelled or closing iteration did not hand out, or
        the next one."""
        if self._in_transit is not None and self._in_transit.deadline_ms <= time.time() * 1000:
            self._in_transit = None  # its lease ended meanwhile: another worker may have it
        if self._in_transit is None:
            self._in_transit = consumer.next_message(ITERATION_WAIT_MS)
        return self._in_transit

    def _close_on_worker(self) -> None:
        if self._in_transit is not None:
            self.consumer._buffer.appendleft(self._in_transit)  # never handed out: close() gives it back
            self._in_transit = None
        self.consumer.close()

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._worker, self._close_on_worker)
        finally:
            self._worker.shutdown(wait=False)

    async def __aenter__(self) -> AsyncQueueConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

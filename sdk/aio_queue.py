"""``AsyncQueueConsumer``: queue mode for asyncio services (``await client.queue_consumer(...)``).

The threaded ``QueueConsumer`` runs on one worker thread of its own (its ZeroMQ sockets
never change threads); each call is awaited there, so the event loop never blocks.

``close()`` may come from another task while ``async for`` waits: it marks the consumer
closing at once (later calls raise ``ClientClosedError``, the iteration ends quietly) and
then closes the threaded consumer on the worker, after any receive already running there.
Iteration takes messages from the threaded consumer's buffer one at a time, so what was
received but not yet handed out is given back by that close, not left to its lease.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
                msg = await self._call(lambda c: c.next_message(ITERATION_WAIT_MS))
            except errors.ClientClosedError:
                return
            if msg is not None and not self._closing:
                yield msg
            # (A message that arrives just as close() begins is not handed out: its lease
            # runs out and it is delivered again, as after a worker's crash.)

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._worker, self.consumer.close)
        finally:
            self._worker.shutdown(wait=False)

    async def __aenter__(self) -> AsyncQueueConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

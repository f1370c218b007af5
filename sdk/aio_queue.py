"""``AsyncQueueConsumer``: queue mode for asyncio services (``await client.queue_consumer(...)``).

The threaded ``QueueConsumer`` runs on one worker thread of its own (its ZeroMQ sockets
never change threads); each call is awaited there, so the event loop never blocks.
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


class AsyncQueueConsumer:
    """``async for msg in consumer`` long-polls for ever; ``await receive/ack/nack/extend``."""

    def __init__(self, worker: concurrent.futures.ThreadPoolExecutor, consumer: QueueConsumer) -> None:
        self._worker = worker
        self.consumer = consumer
        self._closed = False

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
        if self._closed:
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
        while not self._closed:
            # Short polls so that close() is noticed within a second.
            for msg in await self.receive(10, 1_000):
                yield msg

    async def close(self) -> None:
        if self._closed:
            return
        await asyncio.get_running_loop().run_in_executor(self._worker, self.consumer.close)
        self._closed = True
        self._worker.shutdown(wait=False)

    async def __aenter__(self) -> AsyncQueueConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

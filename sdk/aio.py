"""One asyncio entry point over both planes::

    import sdk

    client = await sdk.connect("zk://127.0.0.1:2181")
    producer = client.producer(linger_ms=5)
    metadata = await producer.send("events", b"clicked", key=b"user-1")
    consumer = await client.consumer(["events"])
    async for record in consumer:
        ...
    await client.serve("pricing", handler)                     # the direct plane
    reply = await client.request("pricing", b"AAPL", timeout_ms=200, idempotent=True)
    await client.close()

The durable plane's asyncio flavour wraps the threaded Producer and Consumer: a send
returns an asyncio future bridged from the producer's own future (no thread per send); a
consumer runs its blocking polls on one dedicated worker thread, because its ZeroMQ
sockets must stay on one thread. Queues hang off this client the same way
(``await client.queue_consumer(...)``, sdk/aio_queue.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Literal, TypeVar, overload

from fabric import errors
from sdk._client import Bootstrap, TopicPartition
from sdk._group import OffsetAndMetadata
from sdk.accumulator import Headers, RecordMetadata
from sdk.aio_queue import AsyncQueueConsumer
from sdk.consumer import CommitOffsets, Consumer, HandOut, Record, _one_or_many
from sdk.direct._client import DirectClient
from sdk.direct._pubsub import Subscription
from sdk.direct._server import Service
from sdk.direct._types import GatherResult, Reply
from sdk.producer import Producer

__all__ = ["AsyncClient", "AsyncConsumer", "AsyncProducer", "connect"]

T = TypeVar("T")
CLOSE_TIMEOUT_S = 30.0


class AsyncProducer:
    """``await producer.send(...)`` gives the RecordMetadata once the write is acknowledged;
    keep the futures to pipeline: ``await asyncio.gather(*[producer.send(...) ...])``."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._loop = asyncio.get_running_loop()

    @property
    def closed(self) -> bool:
        """close() was called (send() raises ClientClosedError)."""
        return self.producer.closed

    def send(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
             headers: Headers | dict[str, bytes | str | None] | None = None, partition: int | None = None,
             timestamp_ms: int | None = None, *, tags: Iterable[str] | None = None, delay_ms: int = 0,
             deliver_at_ms: int = 0, priority: int | None = None, dedup_id: str = "",
             ttl_ms: int = 0) -> asyncio.Future[RecordMetadata]:
        """Appends to the producer's buffer now and returns an asyncio future for the
        acknowledgement: ``await`` it for the RecordMetadata, or the record's error
        (DeliveryTimeoutError, ...). ``headers``, ``tags`` and the queue options are
        ``Producer.send``'s (docs/GROUPS.md, docs/QUEUES.md).

        This is a plain method run on the loop's thread, so what ``Producer.send`` raises
        before queueing comes from this call, not from the awaited future: TypeError or
        ValueError for an argument, UnknownTopicOrPartitionError for an unknown topic or a
        partition the topic lacks, BufferFullError, RequestTimedOutError (no metadata within
        ``max_block_ms``), MessageTooLargeError, ClientClosedError. It blocks the event loop
        while it waits: for room while the buffer is full, for the metadata of a topic new
        to the producer (the first send to it: a round trip, but up to ``max_block_ms``
        while no node answers), and up to PARTITION_LEARN_WAIT_MS (3 s) for a partition at
        or past the topic's count. Learn the topics at start-up off the loop,
        ``await asyncio.to_thread(producer.producer.partitions_for, "events")``, and the
        first sends find their metadata there.

        There is no ``callback``: ``future.add_done_callback(fn)`` runs ``fn(future)`` on
        the loop once the record is settled (the producer's sender thread hands the outcome
        to the loop)."""
        loop = self._loop
        future: asyncio.Future[RecordMetadata] = loop.create_future()
        record_future = self.producer.send(topic, value, key=key, headers=headers, partition=partition,
                                           timestamp_ms=timestamp_ms, tags=tags, delay_ms=delay_ms,
                                           deliver_at_ms=deliver_at_ms, priority=priority, dedup_id=dedup_id,
                                           ttl_ms=ttl_ms)

        def settle(metadata: RecordMetadata | None, exc: BaseException | None) -> None:
            if not future.done():
                if exc is not None:
                    future.set_exception(exc)
                else:
                    future.set_result(metadata)  # type: ignore[arg-type]

        def done(metadata: RecordMetadata | None, exc: BaseException | None) -> None:
            # On the sender thread. The loop may close at any moment (asyncio.run returned
            # with sends unawaited): a check of loop.is_closed() before the hand-off would
            # leave a window in which it raises RuntimeError on the sender thread. A closed
            # loop has nobody left to await the future, so the outcome is dropped.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, metadata, exc)

        record_future.add_callback(done)
        return future

    async def flush(self, timeout_s: float | None = None) -> None:
        """``Producer.flush`` on a thread of its own (the loop goes on meanwhile). Cut short
        (``asyncio.wait_for``, ``task.cancel()``), that thread waits on until the records
        are settled (a flush cannot be interrupted); it is not one of the loop's default
        executor's few threads, which ``asyncio.to_thread`` (this producer's ``close()``,
        the direct plane's ZooKeeper calls) shares."""
        await _on_own_thread(self.producer.flush, timeout_s, name="fabric-aio-flush")

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        await asyncio.to_thread(self.producer.close, timeout_s)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncConsumer:
    """``async for record in consumer``: records of the assigned partitions, in offset
    order per partition, until ``close()``."""

    def __init__(self, worker: concurrent.futures.ThreadPoolExecutor, consumer: Consumer, poll_timeout_ms: int) -> None:
        self._worker = worker
        self.consumer = consumer
        self.poll_timeout_ms = poll_timeout_ms
        self._closing = False  # set first by close(); later calls raise ClientClosedError

    @property
    def closed(self) -> bool:
        """close() was called (later calls raise ClientClosedError)."""
        return self._closing

    @classmethod
    async def create(cls, bootstrap: str | None = None, *, poll_timeout_ms: int = 500, **config: Any) -> AsyncConsumer:
        """A Consumer made on its own worker thread; ``bootstrap`` and ``config`` are
        Consumer's (None: ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded)."""
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fabric-aio-consumer")
        made = worker.submit(lambda: Consumer(bootstrap, **config))
        try:
            consumer = await asyncio.wrap_future(made)
        except BaseException:
            # Cancelled (asyncio.wait_for, task.cancel()) while it was being made, or just
            # after: the worker goes on making it and nobody would ever close it. Queued
            # behind it on its own worker (its sockets' thread, and never blocking the
            # loop), the close runs once it exists (AsyncQueueConsumer.create closes its
            # consumer the same way, from a done callback).
            worker.submit(_close_if_made, made)
            worker.shutdown(wait=False)
            raise
        return cls(worker, consumer, poll_timeout_ms)

    async def _call(self, fn: Callable[[Consumer], T]) -> T:
        if self._closing:
            raise errors.ClientClosedError("consumer is closed")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, self.consumer)

    async def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        items = list(partitions)
        await self._call(lambda c: c.assign(items))

    async def subscribe_all_partitions(self, topic: str) -> list[TopicPartition]:
        return await self._call(lambda c: c.subscribe_all_partitions(topic))

    async def unsubscribe(self) -> None:
        """``Consumer.unsubscribe``: leave the group (committing first with auto commit)."""
        await self._call(lambda c: c.unsubscribe())

    async def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        await self._call(lambda c: c.seek(partition, offset))

    async def seek_to_beginning(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        await self._call(lambda c: c.seek_to_beginning(*partitions))

    async def seek_to_end(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        await self._call(lambda c: c.seek_to_end(*partitions))

    async def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        return await self._call(lambda c: c.position(partition))

    # Kafka's flow control, as ``Consumer``'s (docs/GROUPS.md): an ``async for`` stops
    # handing out a partition's records as soon as ``await pause(tp)`` returns.
    async def pause(self, partitions: TopicPartition | tuple[str, int]
                    | Iterable[TopicPartition | tuple[str, int]]) -> None:
        items = _one_or_many("partitions", partitions)  # a generator is read here, not on the worker
        await self._call(lambda c: c.pause(items))

    async def resume(self, partitions: TopicPartition | tuple[str, int]
                     | Iterable[TopicPartition | tuple[str, int]]) -> None:
        items = _one_or_many("partitions", partitions)
        await self._call(lambda c: c.resume(items))

    async def paused(self) -> set[TopicPartition]:
        return await self._call(lambda c: c.paused())

    # In a group (``client.consumer(topics, group_id=...)``), as ``Consumer``'s: with
    # ``enable_auto_commit=False`` these are how an asyncio service commits.
    async def subscribe(self, topics: Iterable[str] | None = None, **options: Any) -> None:
        """``Consumer.subscribe`` on the worker: ``pattern=``, ``listener=``, ``tag_filter=``.
        A ``listener``'s hooks run on the worker thread (no event loop runs there), inside
        this call, ``poll()``, ``async for``, ``unsubscribe()`` and ``close()``, whose
        ``await`` raises what a hook raised; they must be plain ``def`` (an ``async def``
        hook is a TypeError here: it would never be awaited)."""
        names = None if topics is None else list(topics)
        await self._call(lambda c: c.subscribe(names, **options))

    async def commit(self, offsets: CommitOffsets | None = None) -> None:
        """``Consumer.commit``: ``offsets``, or the positions of everything handed out."""
        await self._call(lambda c: c.commit(offsets))

    @overload
    async def committed(self, partition: TopicPartition | tuple[str, int], *,
                        metadata: Literal[False] = False) -> int | None: ...

    @overload
    async def committed(self, partition: TopicPartition | tuple[str, int], *,
                        metadata: Literal[True]) -> OffsetAndMetadata | None: ...

    @overload  # a flag known only at run time (a wrapper passing it on)
    async def committed(self, partition: TopicPartition | tuple[str, int], *,
                        metadata: bool) -> int | OffsetAndMetadata | None: ...

    async def committed(self, partition: TopicPartition | tuple[str, int], *,
                        metadata: bool = False) -> int | OffsetAndMetadata | None:
        """``Consumer.committed``: the offset, or with ``metadata=True`` an OffsetAndMetadata."""
        return await self._call(lambda c: c.committed(partition, metadata=metadata))

    async def assignment(self) -> list[TopicPartition]:
        return await self._call(lambda c: c.assignment())

    async def poll(self, timeout_ms: int = 1000, max_records: int = 10_000) -> list[Record]:
        """``Consumer.poll`` on the worker. Cancelled meanwhile (``asyncio.wait_for``,
        ``task.cancel()``), it hands its records to nobody: their partitions are read again
        from the first of them by the next poll, and no commit covers them."""
        if self._closing:
            raise errors.ClientClosedError("consumer is closed")
        polled = self._worker.submit(self.consumer.poll, timeout_ms, max_records)
        try:
            return await asyncio.wrap_future(polled)
        except asyncio.CancelledError:
            # The poll runs on (a worker thread cannot be interrupted) and moves the
            # positions past what it returns, which the caller never sees: the next commit
            # (auto commit, close()) skipped them for good. Queued on the same worker, so
            # it runs right after that poll and before any later call.
            if not polled.cancelled():
                with contextlib.suppress(RuntimeError):  # the worker is shut down: closed meanwhile
                    self._worker.submit(_give_back, self.consumer, polled)
            raise

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._records()

    async def _records(self) -> AsyncIterator[Record]:
        # As the threaded iterator (sdk.consumer.HandOut): a position moves past a record
        # when the caller asks for the next, so a loop left early commits only what it
        # finished. The poll leaves positions at the first records on the worker thread, in
        # the same call (a close queued behind it commits nothing unread); they are then
        # moved here, on the loop, while the worker is idle, one dict item at a time.
        while not self._closing:
            hand_out = await self._call(lambda c: c.poll_for_hand_out(self.poll_timeout_ms))
            for record in hand_out.records:
                if self._closing:
                    break
                if self.consumer.between_records_due():
                    # Heartbeat, session clock, auto commit: on the worker, as a poll.
                    await self._call(lambda c: c.between_records())
                    if self.consumer.between_records_due():
                        # The loop was held up while that ran (another task's blocking code):
                        # the session clock may have run out since, and this record would go
                        # out only now, of a partition the group may have given to another
                        # member: looked at again (once: the threaded iterator's check).
                        await self._call(lambda c: c.between_records())
                if hand_out.take(record):
                    yield record
                    hand_out.done(record)
            else:
                hand_out.finish()
            # Left early: the consumer's next poll reads on from where the caller stopped.

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True  # first: an ``async for`` in another task stops handing out
        try:
            await asyncio.get_running_loop().run_in_executor(self._worker, self.consumer.close)
        except BaseException:
            # Cancelled (asyncio.wait_for): the close goes on on the worker; waiting for it
            # here would block the event loop until it ends.
            self._worker.shutdown(wait=False)
            raise
        self._worker.shutdown(wait=True)  # the close ran: the worker is idle, this is quick

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _on_own_thread(fn: Callable[[float | None], None], arg: float | None, *, name: str) -> None:
    """``fn(arg)`` on a new daemon thread. A few flushes cut short while no node answered
    held every thread of the loop's default executor until their records failed (the
    delivery timeout, 2 min by default): a ``close(timeout_s=2)`` queued behind them, and
    every ``asyncio.to_thread`` of the application and of the direct plane, waited as long."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()
    done.set_running_or_notify_cancel()  # running: a cancelled await leaves it to the thread

    def run() -> None:
        try:
            fn(arg)
        except BaseException as exc:  # handed to the awaiting task
            done.set_exception(exc)
        else:
            done.set_result(None)

    threading.Thread(target=run, name=name, daemon=True).start()
    await asyncio.wrap_future(done)


def _give_back(consumer: Consumer, polled: concurrent.futures.Future[list[Record]]) -> None:
    """On the consumer's worker, after a poll whose caller was cancelled: each partition's
    position back at the first record the poll returned, as an iteration left early leaves
    it (``HandOut``), so that the next poll reads those records again."""
    if polled.cancelled() or polled.exception() is not None or consumer._closed:
        return
    records = polled.result()
    if records:
        HandOut(consumer, records)


def _close_if_made(made: concurrent.futures.Future[Consumer]) -> None:
    """On the consumer's worker, after its creation: close the Consumer of a creation
    whose caller was cancelled (nothing if it was never made, or failed)."""
    if not made.cancelled() and made.exception() is None:
        made.result().close()


class AsyncClient:
    """Topics and direct services from one place. Make one with ``await sdk.connect()``."""

    def __init__(self, bootstrap: str, direct: DirectClient | None) -> None:
        self.bootstrap = bootstrap
        self._direct = direct
        self._producers: dict[str, AsyncProducer] = {}  # by options: producer()
        self._consumers: list[AsyncConsumer] = []
        self._queue_consumers: list[AsyncQueueConsumer] = []
        self._closed = False  # close() was called: nothing new is made (it would never be closed)

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosedError("the client is closed")

    @property
    def direct(self) -> DirectClient:
        if self._direct is None:
            raise errors.NoServiceAvailable(
                "the direct plane finds services through ZooKeeper: connect with a zk://host:port bootstrap")
        return self._direct

    # The durable plane.
    def producer(self, **config: Any) -> AsyncProducer:
        """The client's producer for these options: made on first use, then the same one
        for the same options (a producer is a thread, sockets and a buffer, meant to be
        shared, as Kafka's), closed by ``client.close()``; one closed meanwhile is replaced."""
        self._check_open()
        # From the loop's thread only: asked first, so that elsewhere it raises before a
        # Producer (a sender thread, sockets) is made and left behind.
        asyncio.get_running_loop()
        key = repr(sorted(config.items()))
        producer = self._producers.get(key)
        if producer is None or producer.closed:
            producer = self._producers[key] = AsyncProducer(Producer(self.bootstrap, **config))
        return producer

    async def consumer(self, topics: Iterable[str] = (), **config: Any) -> AsyncConsumer:
        """A consumer of ``topics``: with ``group_id=...`` in ``config`` it joins that group
        (partitions shared with the other members, offsets committed); without, it reads
        every partition itself (``auto_offset_reset`` decides where it starts). ``config``
        is ``Consumer``'s options, so a rebalance listener is not one of them: make the
        consumer with no topics, then ``await consumer.subscribe(topics, listener=...)``."""
        self._check_open()
        names = list(topics)
        consumer = await AsyncConsumer.create(self.bootstrap, **config)
        # The ones their owners closed are forgotten: a long-lived client making a consumer
        # per task kept every closed one (and its Consumer) for ever.
        self._consumers = [c for c in self._consumers if not c.closed]
        self._consumers.append(consumer)  # at once: closed by close() even if what follows is cancelled
        try:
            if names and config.get("group_id") is not None:
                await consumer._call(lambda c: c.subscribe(names))
            else:
                for topic in names:
                    await consumer.subscribe_all_partitions(topic)
        except BaseException:
            # Failed or cancelled (asyncio.wait_for) half made: leave the group now, not
            # after its session timeout with the group's partitions held meanwhile.
            self._consumers.remove(consumer)
            await asyncio.shield(consumer.close())
            raise
        if self._closed:
            await consumer.close()
            raise errors.ClientClosedError("the client was closed meanwhile")
        return consumer

    async def queue_consumer(self, queue: str, group: str = "default", **options: Any) -> AsyncQueueConsumer:
        """A worker of ``queue`` in ``group`` (docs/QUEUES.md): messages leased one worker
        at a time, ``await ack/nack/extend``."""
        self._check_open()
        consumer = await AsyncQueueConsumer.create(self.bootstrap, queue, group, **options)
        self._queue_consumers = [c for c in self._queue_consumers if not c.closed]  # as consumer()'s
        self._queue_consumers.append(consumer)
        if self._closed:
            await consumer.close()
            raise errors.ClientClosedError("the client was closed meanwhile")
        return consumer

    # The direct plane (sdk.direct.DirectClient has the full documentation).
    async def request(self, name: str, payload: bytes | str, **options: Any) -> Reply:
        return await self.direct.request(name, payload, **options)

    async def gather(self, name: str, payload: bytes | str, **options: Any) -> GatherResult:
        return await self.direct.gather(name, payload, **options)

    async def serve(self, name: str, handler: Callable[..., Any], **options: Any) -> Service:
        return await self.direct.serve(name, handler, **options)

    async def publish(self, subject: str, payload: bytes | str, **options: Any) -> None:
        await self.direct.publish(subject, payload, **options)

    async def services(self) -> dict[str, Any]:
        """Every registered service and its instances, read from ZooKeeper now."""
        return await self.direct.services()

    async def start_publisher(self) -> None:
        """Bind and register this client's PUB socket now, not on the first publish."""
        await self.direct.start_publisher()

    async def subscribe(self, pattern: str, handler: Callable[..., Any] | None = None, **options: Any) -> Subscription:
        return await self.direct.subscribe(pattern, handler, **options)

    async def close(self) -> None:
        """Services deregister and drain first, then producers flush, then the rest closes,
        each also when one before it failed (the first error is raised at the end). Later
        calls that would make something new raise ClientClosedError."""
        self._closed = True
        closes: list[Callable[[], Awaitable[None]]] = [] if self._direct is None else [self._direct.close]
        closes += [producer.close for producer in self._producers.values()]
        closes += [consumer.close for consumer in self._consumers]
        closes += [queue_consumer.close for queue_consumer in self._queue_consumers]
        # Each one, also after one that raised (a consumer's close raises what its rebalance
        # listener raised): those after it were left open, their worker threads and sockets
        # with them. The first error is raised once all are closed.
        first_error: Exception | None = None
        for close in closes:
            try:
                await close()
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(bootstrap: str | None = None, **direct_options: Any) -> AsyncClient:
    """``zk://host:port[/chroot]`` gives both planes; node addresses give topics only.
    None: ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded (ConfigError if
    neither, fabric/bootstrap.py), found once, here: the client's producers and consumers
    use that address."""
    spec = Bootstrap(bootstrap)
    direct = await DirectClient.connect(spec.zk, **direct_options) if spec.zk is not None else None
    return AsyncClient(bootstrap if bootstrap is not None else spec.text, direct)

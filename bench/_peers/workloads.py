"""One workload, four ways: Fabric, NATS JetStream, Redis Streams (and request-reply).

Every system is driven by the Python client its users would use (the Fabric SDK, nats-py,
redis-py), the way each client's documentation recommends for speed: Fabric's producer
batches by itself, nats-py pipelines publishes with ``publish_async`` (a bounded window of
unacknowledged publishes), redis-py pipelines XADDs. Each publish is durable by the
system's own meaning (acknowledged by the server after it stored it) and every run checks
that the stream holds exactly what was sent, so a fast number cannot come from a lost
message.

A ``Spec`` is a plain dict (so a spawned consumer process can rebuild the adapter); every
adapter offers ``create``, ``publish``, ``consume``, ``publish_paced`` and, in another
process, ``e2e_consume``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

VALUE_BYTES = 100
VALUE = b"v" * VALUE_BYTES
STAMP_DIGITS = 20  # an e2e value starts with time.perf_counter_ns() in 20 ASCII digits
E2E_PAD = b"v" * (VALUE_BYTES - STAMP_DIGITS)

NATS_PUBLISH_WINDOW = 4_000  # unacknowledged publish_async calls in flight (the nats-py default)
NATS_FETCH_BATCH = 1_000
REDIS_PIPELINE = 1_000
REDIS_READ_COUNT = 1_000
CONSUME_TIMEOUT_S = 120.0  # a consume that has not seen every message by then is a failure
REQUEST_TIMEOUT_S = 5.0

Spec = dict[str, Any]
Progress = Callable[[int], None]


def stamped() -> bytes:
    """A 100-byte value that carries its send time (CLOCK_MONOTONIC, one clock machine-wide)."""
    return b"%020d" % time.perf_counter_ns() + E2E_PAD


def paced(count: int, rate_per_s: float) -> Iterator[float]:
    """Yield i's seconds-ahead-of-schedule at a fixed rate; the caller sleeps that long."""
    started = time.perf_counter()
    for i in range(count):
        yield i / rate_per_s - (time.perf_counter() - started)


class Incomplete(RuntimeError):
    """A system stored or delivered a different number of messages than were sent."""


def make(spec: Spec) -> Any:
    kind = spec["system"]
    if kind == "fabric":
        return FabricAdapter(spec)
    if kind == "nats":
        return NatsAdapter(spec)
    if kind == "redis":
        return RedisAdapter(spec)
    raise ValueError(f"unknown system {kind!r}")


# -- Fabric -------------------------------------------------------------------------------

class FabricAdapter:
    def __init__(self, spec: Spec) -> None:
        self.bootstrap: str = spec["bootstrap"]
        self.acks: int | str = spec["acks"]
        self.replication_factor: int = spec["replication_factor"]
        self.partitions: int = spec["partitions"]

    def create(self, stream: str) -> None:
        from sdk import Admin

        with Admin(self.bootstrap) as admin:
            admin.create_topic(stream, partitions=self.partitions, replication_factor=self.replication_factor)

    def publish(self, stream: str, count: int, progress: Progress) -> float:
        from sdk import Producer

        with Producer(self.bootstrap, acks=self.acks, linger_ms=5) as producer:
            producer.send(stream, b"warm-up").result(30)
            send = producer.send
            started = time.perf_counter()
            for i in range(count):
                send(stream, VALUE)
                if i % 10_000 == 9_999:
                    progress(10_000)
            producer.flush(timeout=300)
            elapsed = time.perf_counter() - started
        progress(count % 10_000)
        return elapsed

    def _consumer(self, stream: str, **kwargs: Any) -> Any:
        from sdk import Consumer, TopicPartition

        consumer = Consumer(self.bootstrap, **kwargs)
        consumer.assign([TopicPartition(stream, p) for p in range(self.partitions)])
        return consumer

    def consume(self, stream: str, count: int, progress: Progress) -> float:
        # count + 1: the publish phase's warm-up record is in the topic too.
        wanted, got = count + 1, 0
        consumer = self._consumer(stream)
        try:
            consumer.seek_to_beginning()
            started = time.perf_counter()
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while got < wanted and time.monotonic() < deadline:
                for batch in consumer.poll_batches(timeout_ms=1000):
                    got += len(batch.values)
                    progress(len(batch.values))
            elapsed = time.perf_counter() - started
        finally:
            consumer.close()
        if got != wanted:
            raise Incomplete(f"fabric: consumed {got} of {wanted} records")
        return elapsed

    def publish_paced(self, stream: str, count: int, rate_per_s: float, progress: Progress) -> None:
        from sdk import Producer

        with Producer(self.bootstrap, acks=self.acks, linger_ms=0) as producer:
            for ahead in paced(count, rate_per_s):
                if ahead > 0:
                    time.sleep(ahead)
                producer.send(stream, stamped())
                progress(1)
            producer.flush(timeout=60)

    def e2e_consume(self, stream: str, total: int, ready: Any, deadline_s: float) -> list[int]:
        latencies_ns: list[int] = []
        consumer = self._consumer(stream, fetch_max_wait_ms=100)
        try:
            consumer.seek_to_end()
            consumer.poll_batches(timeout_ms=0)
            ready.set()
            deadline = time.monotonic() + deadline_s
            while len(latencies_ns) < total and time.monotonic() < deadline:
                for batch in consumer.poll_batches(timeout_ms=100):
                    now = time.perf_counter_ns()
                    latencies_ns.extend(now - int(v[:STAMP_DIGITS]) for v in batch.values if v)
        finally:
            consumer.close()
        return latencies_ns


# -- NATS JetStream -----------------------------------------------------------------------

class NatsAdapter:
    def __init__(self, spec: Spec) -> None:
        self.url: str = spec["url"]

    async def _connect(self) -> Any:
        import nats

        # A pending buffer large enough for a full publish window of 100-byte messages.
        return await nats.connect(self.url, pending_size=64 * 1024 * 1024, max_reconnect_attempts=0)

    def create(self, stream: str) -> None:
        async def run() -> None:
            from nats.js.api import StorageType

            nc = await self._connect()
            try:
                await nc.jetstream().add_stream(name=stream, subjects=[stream], storage=StorageType.FILE,
                                                num_replicas=1)
            finally:
                await nc.close()

        asyncio.run(run())

    def publish(self, stream: str, count: int, progress: Progress) -> float:
        async def run() -> float:
            nc = await self._connect()
            try:
                js = nc.jetstream(publish_async_max_pending=NATS_PUBLISH_WINDOW)
                await js.publish(stream, b"warm-up")
                started = time.perf_counter()
                futures = []
                for i in range(count):
                    futures.append(await js.publish_async(stream, VALUE))
                    if i % 10_000 == 9_999:
                        progress(10_000)
                acks = await asyncio.gather(*futures)
                elapsed = time.perf_counter() - started
                progress(count % 10_000)
                stored = (await js.stream_info(stream)).state.messages
                if len(acks) != count or stored != count + 1:
                    raise Incomplete(f"nats: {len(acks)} acknowledged, {stored} stored of {count + 1}")
                return elapsed
            finally:
                await nc.close()

        return asyncio.run(run())

    def consume(self, stream: str, count: int, progress: Progress) -> float:
        async def run() -> float:
            import nats.errors
            from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

            nc = await self._connect()
            try:
                js = nc.jetstream()
                # A pull consumer that needs no acks: the fastest documented way to read a
                # stream from the start with nats-py.
                sub = await js.pull_subscribe(stream, stream=stream, config=ConsumerConfig(
                    ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
                wanted, got = count + 1, 0
                started = time.perf_counter()
                deadline = time.monotonic() + CONSUME_TIMEOUT_S
                while got < wanted and time.monotonic() < deadline:
                    try:
                        msgs = await sub.fetch(batch=min(NATS_FETCH_BATCH, wanted - got), timeout=5)
                    except nats.errors.TimeoutError:
                        continue
                    got += len(msgs)
                    progress(len(msgs))
                elapsed = time.perf_counter() - started
                await sub.unsubscribe()
                if got != wanted:
                    raise Incomplete(f"nats: consumed {got} of {wanted} messages")
                return elapsed
            finally:
                await nc.close()

        return asyncio.run(run())

    def publish_paced(self, stream: str, count: int, rate_per_s: float, progress: Progress) -> None:
        async def run() -> None:
            nc = await self._connect()
            try:
                js = nc.jetstream(publish_async_max_pending=NATS_PUBLISH_WINDOW)
                futures = []
                for ahead in paced(count, rate_per_s):
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                    futures.append(await js.publish_async(stream, stamped()))
                    progress(1)
                await asyncio.gather(*futures)
            finally:
                await nc.close()

        asyncio.run(run())

    def e2e_consume(self, stream: str, total: int, ready: Any, deadline_s: float) -> list[int]:
        async def run() -> list[int]:
            from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

            latencies_ns: list[int] = []
            done = asyncio.Event()

            async def on_message(msg: Any) -> None:
                latencies_ns.append(time.perf_counter_ns() - int(msg.data[:STAMP_DIGITS]))
                if len(latencies_ns) >= total:
                    done.set()

            nc = await self._connect()
            try:
                # A push consumer: the server sends each message as it is stored, the
                # low-latency way to follow a stream in NATS.
                await nc.jetstream().subscribe(stream, cb=on_message, stream=stream, config=ConsumerConfig(
                    ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW))
                ready.set()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(done.wait(), timeout=deadline_s)
            finally:
                await nc.close()
            return latencies_ns

        return asyncio.run(run())


# -- Redis Streams ------------------------------------------------------------------------

class RedisAdapter:
    def __init__(self, spec: Spec) -> None:
        self.port: int = spec["port"]

    def _client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)

    def create(self, stream: str) -> None:
        with self._client() as client:
            client.delete(stream)

    def publish(self, stream: str, count: int, progress: Progress) -> float:
        with self._client() as client:
            client.xadd(stream, {b"v": b"warm-up"})
            started = time.perf_counter()
            sent = 0
            while sent < count:
                chunk = min(REDIS_PIPELINE, count - sent)
                pipe = client.pipeline(transaction=False)
                for _ in range(chunk):
                    pipe.xadd(stream, {b"v": VALUE})
                pipe.execute()
                sent += chunk
                progress(chunk)
            elapsed = time.perf_counter() - started
            stored = client.xlen(stream)
        if stored != count + 1:
            raise Incomplete(f"redis: {stored} stored of {count + 1}")
        return elapsed

    def consume(self, stream: str, count: int, progress: Progress) -> float:
        wanted, got, last_id = count + 1, 0, b"0-0"
        with self._client() as client:
            started = time.perf_counter()
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while got < wanted and time.monotonic() < deadline:
                reply = client.xread({stream: last_id}, count=REDIS_READ_COUNT, block=1000)
                for _name, entries in reply or ():
                    got += len(entries)
                    last_id = entries[-1][0]
                    progress(len(entries))
            elapsed = time.perf_counter() - started
        if got != wanted:
            raise Incomplete(f"redis: consumed {got} of {wanted} entries")
        return elapsed

    def publish_paced(self, stream: str, count: int, rate_per_s: float, progress: Progress) -> None:
        # One XADD per message: at a fixed rate there is nothing to pipeline with.
        with self._client() as client:
            for ahead in paced(count, rate_per_s):
                if ahead > 0:
                    time.sleep(ahead)
                client.xadd(stream, {b"v": stamped()})
                progress(1)

    def e2e_consume(self, stream: str, total: int, ready: Any, deadline_s: float) -> list[int]:
        latencies_ns: list[int] = []
        with self._client() as client:
            last_id = b"0-0"  # the stream is new and empty: everything in it is this run's
            ready.set()
            deadline = time.monotonic() + deadline_s
            while len(latencies_ns) < total and time.monotonic() < deadline:
                reply = client.xread({stream: last_id}, count=REDIS_READ_COUNT, block=100)
                now = time.perf_counter_ns()
                for _name, entries in reply or ():
                    latencies_ns.extend(now - int(fields[b"v"][:STAMP_DIGITS]) for _id, fields in entries)
                    last_id = entries[-1][0]
        return latencies_ns


def e2e_consumer_process(spec: Spec, stream: str, total: int, deadline_s: float, ready: Any, results: Any) -> None:
    """Entry point of the spawned consumer process (a real consumer is another process)."""
    results.put(make(spec).e2e_consume(stream, total, ready, deadline_s))

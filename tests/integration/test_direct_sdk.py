"""The SDK's entry points over both planes: ``sdk.connect`` (asyncio) and ``sdk.Client``
(blocking), sync handlers with bounded concurrency, and a client that keeps working on its
cached registry while ZooKeeper is down."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

import pytest

import sdk
from fabric import errors
from fabric.local import LocalCluster, LocalZooKeeper
from sdk import TopicPartition
from sdk.direct import DirectClient, Request, Subscription
from sdk.direct import _registry as registry


def test_async_client_reaches_topics_and_services(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    with sdk.Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)

    async def run() -> tuple[list[int], list[bytes], bytes]:
        client = await sdk.connect(bootstrap)
        try:
            producer = client.producer(linger_ms=1)
            metadata = await asyncio.gather(*[producer.send(topic_name, f"v{n}", partition=0) for n in range(20)])
            consumer = await client.consumer([topic_name])
            seen: list[bytes] = []
            async for record in consumer:
                seen.append(record.value or b"")
                if len(seen) == 20:
                    break
            await client.serve("upper", lambda request: request.payload.upper())
            reply = await client.request("upper", b"abc", timeout_ms=5_000)
            return [m.offset for m in metadata], seen, reply.payload
        finally:
            await client.close()

    offsets, seen, upper = asyncio.run(run())
    assert offsets == list(range(20))
    assert seen == [f"v{n}".encode() for n in range(20)]
    assert upper == b"ABC"


def test_sync_client_with_sync_handlers_and_concurrency(zk_server: LocalZooKeeper) -> None:
    bootstrap = f"zk://{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"
    running = 0
    peak = 0
    lock = threading.Lock()

    def slow_handler(request: Request) -> bytes:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        if request.payload == b"bad":
            raise KeyError("missing")
        return request.payload + request.headers.get("suffix", b"")

    with sdk.Client(bootstrap) as server, sdk.Client(bootstrap) as client:
        server.serve("slow", slow_handler, concurrency=3, version="2.1", metadata={"zone": "a"})
        results: list[bytes] = []

        def call(n: int) -> None:
            results.append(client.request("slow", f"r{n}", headers={"suffix": "!"}, timeout_ms=10_000).payload)

        threads = [threading.Thread(target=call, args=(n,)) for n in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(results) == sorted(f"r{n}!".encode() for n in range(12))
        assert peak == 3  # the concurrency bound held, and was used
        with pytest.raises(errors.RemoteError) as caught:
            client.request("slow", "bad")
        assert caught.value.remote_type == "KeyError"  # type: ignore[attr-defined]
        (instances,) = client.services()["slow"].values()
        assert (instances.version, instances.metadata) == ("2.1", {"zone": "a"})


def test_sync_handler_threads_answer_a_pipelined_flood_and_drain_on_stop(zk_server: LocalZooKeeper) -> None:
    """Sync-handler threads send their replies on the ROUTER themselves, beside the loop
    that reads it: thousands of requests in flight from two callers must all be answered,
    each with its own payload (no reply lost to a hidden read edge, no frames of two
    replies interleaved); the threads stay within ``concurrency``; stop() waits for a
    handler still running and its reply still arrives; the threads end after stop()."""
    hosts = f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"
    release = threading.Event()

    def handler(request: Request) -> bytes:
        if request.payload == b"hold":
            release.wait(10)
        elif request.payload.startswith(b"fail"):
            raise ValueError(request.payload.decode())
        return request.payload[::-1]

    async def run() -> None:
        server = await DirectClient.connect(hosts)
        callers = [await DirectClient.connect(hosts) for _ in range(2)]
        try:
            service = await server.serve("flood", handler, concurrency=4, queue_max=10_000)
            count = 1500

            async def one(caller: DirectClient, n: int) -> bytes | str:
                payload = f"{'fail' if n % 97 == 0 else 'req'}-{n}".encode()
                try:
                    return (await caller.request("flood", payload, timeout_ms=30_000)).payload
                except errors.RemoteError as exc:
                    return exc.message

            answers = await asyncio.gather(*[one(callers[n % 2], n) for n in range(count)])
            for n, answer in enumerate(answers):
                if n % 97 == 0:
                    assert isinstance(answer, str) and f"fail-{n}" in answer
                else:
                    assert answer == f"req-{n}".encode()[::-1]
            assert (service.handled, service.failed) == (count - len(range(0, count, 97)), len(range(0, count, 97)))
            threads = [t for t in threading.enumerate() if t.name.startswith("svc-flood-")]
            assert 1 <= len(threads) <= 4

            held = asyncio.ensure_future(callers[0].request("flood", b"hold", timeout_ms=30_000))
            while service.in_flight == 0:
                await asyncio.sleep(0.01)
            stopping = asyncio.ensure_future(service.stop(drain_timeout_ms=10_000))
            await asyncio.sleep(0.3)
            assert not stopping.done()  # draining: the held handler still runs
            release.set()
            assert (await held).payload == b"dloh"
            await stopping
            deadline = time.monotonic() + 5
            while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not any(t.is_alive() for t in threads)
        finally:
            for caller in callers:
                await caller.close()
            await server.close()

    asyncio.run(run())


def test_overloaded_instance_refuses_without_running(zk_server: LocalZooKeeper) -> None:
    hosts = f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"

    async def run() -> tuple[int, int]:
        server = await DirectClient.connect(hosts)
        client = await DirectClient.connect(hosts)
        ran = 0

        async def handler(request: Request) -> bytes:
            nonlocal ran
            ran += 1
            await asyncio.sleep(0.3)
            return b"ok"

        try:
            await server.serve("tiny", handler, concurrency=1, queue_max=1)
            calls = [client.request("tiny", b"x", timeout_ms=5_000, attempts_max=1) for _ in range(4)]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            refused = sum(isinstance(o, errors.NoServiceAvailable) and "SERVICE_OVERLOADED" in str(o) for o in outcomes)
            return refused, ran
        finally:
            await client.close()
            await server.close()

    refused, ran = asyncio.run(run())
    assert refused == 2 and ran == 2  # one running, one queued, two refused and never run


def test_cached_registry_serves_while_zookeeper_is_down(tmp_path: Path) -> None:
    zookeeper = LocalZooKeeper(tmp_path / "zk")
    zookeeper.start()
    try:
        async def run() -> list[bytes]:
            server = await DirectClient.connect(zookeeper.address)
            client = await DirectClient.connect(zookeeper.address)
            try:
                await server.serve("quotes", lambda request: b"q:" + request.payload)
                replies = [(await client.request("quotes", b"1", timeout_ms=5_000)).payload]
                await asyncio.to_thread(zookeeper.stop)
                for n in range(2, 6):  # ZooKeeper is gone: the cached instances keep answering
                    replies.append((await client.request("quotes", str(n), timeout_ms=5_000)).payload)
                    await asyncio.sleep(0.3)
                return replies
            finally:
                await client.close(drain_timeout_ms=1_000)
                await server.close(drain_timeout_ms=1_000)

        assert asyncio.run(run()) == [b"q:1", b"q:2", b"q:3", b"q:4", b"q:5"]
    finally:
        zookeeper.stop()


def test_cached_registry_serves_while_zookeeper_is_paused(tmp_path: Path) -> None:
    """SIGSTOP, not a clean stop: connections stay open and simply go silent."""
    zookeeper = LocalZooKeeper(tmp_path / "zk")
    zookeeper.start()
    try:
        async def run() -> tuple[list[bytes], errors.FabricError | None]:
            server = await DirectClient.connect(zookeeper.address)
            client = await DirectClient.connect(zookeeper.address)
            unknown: errors.FabricError | None = None
            try:
                await server.serve("quotes", lambda request: b"q:" + request.payload)
                replies = [(await client.request("quotes", b"0", timeout_ms=5_000)).payload]
                zookeeper.pause()
                try:
                    for n in range(1, 8):  # 2 s, within the 10 s session: nothing expires
                        replies.append((await client.request("quotes", str(n), timeout_ms=5_000)).payload)
                        await asyncio.sleep(0.3)
                    try:
                        await client.request("never-seen", b"x", timeout_ms=1_000)
                    except errors.FabricError as exc:  # a name not cached needs ZooKeeper: a clear error
                        unknown = exc
                finally:
                    zookeeper.resume()
                return replies, unknown
            finally:
                await client.close(drain_timeout_ms=1_000)
                await server.close(drain_timeout_ms=1_000)

        replies, unknown = asyncio.run(run())
        assert replies == [f"q:{n}".encode() for n in range(8)]
        assert isinstance(unknown, errors.NoServiceAvailable)
    finally:
        zookeeper.stop()


@pytest.mark.slow
def test_requests_continue_through_a_zookeeper_pause_longer_than_the_session(tmp_path: Path) -> None:
    """ZooKeeper SIGSTOPped past the 10 s session timeout: on resume the instance's session
    is expired (its znode deleted) and it registers again under a new name; callers keep
    using the instance that still answers heartbeats all along. The publisher registers
    again too, so its subscribers find it again."""
    zookeeper = LocalZooKeeper(tmp_path / "zk")
    zookeeper.start()
    try:
        async def published_and_received(server: DirectClient, subscription: Subscription) -> bool:
            for n in range(200):  # PUB/SUB drops what comes before the connection: retry
                await server.publish("ticks.now", str(n))
                if await subscription.next(timeout_ms=100) is not None:
                    return True
            return False

        async def run() -> tuple[list[int], list[str], str | None, str | None]:
            server = await DirectClient.connect(zookeeper.address)
            client = await DirectClient.connect(zookeeper.address)
            failures: list[str] = []
            done = [0, 0]  # answered while ZooKeeper was stopped, and after it came back
            try:
                service = await server.serve("quotes", lambda request: b"q:" + request.payload)
                first_znode = service.znode
                await client.request("quotes", b"warm", timeout_ms=5_000)
                subscription = await client.subscribe("ticks.>")
                await server.start_publisher()
                assert await published_and_received(server, subscription)
                zookeeper.pause()
                paused_at = time.monotonic()
                resumed = False
                while time.monotonic() - paused_at < 18.0:
                    if not resumed and time.monotonic() - paused_at > 13.0:
                        zookeeper.resume()
                        resumed = True
                    try:
                        # A generous timeout: the point is that requests keep being answered,
                        # not how fast, and a loaded machine may stall this loop for a while.
                        await client.request("quotes", b"x", timeout_ms=5_000)
                        done[resumed] += 1
                    except errors.FabricError as exc:
                        failures.append(f"{time.monotonic() - paused_at:.1f}s {exc}")
                    await asyncio.sleep(0.1)
                while await subscription.next(timeout_ms=10) is not None:
                    pass  # what came through before the expiry was noticed
                await asyncio.sleep(1.0)  # the subscriber's watch sees the publisher's new znode
                assert await published_and_received(server, subscription), "the publisher never came back"
                return done, failures, first_znode, service.znode
            finally:
                zookeeper.resume()
                await client.close(drain_timeout_ms=1_000)
                await server.close(drain_timeout_ms=1_000)

        done, failures, first, last = asyncio.run(run())
        assert not failures, failures
        assert done[0] > 0 and done[1] > 0, f"answered while ZooKeeper was stopped / after: {done}"
        print(f"{done} requests through the pause; znode {first} -> {last}")
    finally:
        zookeeper.stop()


def test_services_and_publishers_register_again_after_their_session_expires(zk_server: LocalZooKeeper) -> None:
    """A real session expiry, forced as kazoo's test harness does (join the session with its
    id and password, then close it): ZooKeeper deletes the ephemeral znodes; the service
    and the publisher create theirs again, and callers and subscribers carry on."""
    from kazoo.client import KazooClient

    from fabric.zk import close_client

    hosts = f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"

    async def published_and_received(server: DirectClient, subscription: Subscription) -> bool:
        for n in range(100):  # PUB/SUB drops what comes before the connection: retry
            await server.publish("ticks.now", str(n))
            if await subscription.next(timeout_ms=100) is not None:
                return True
        return False

    def expire(zk: KazooClient) -> None:
        hijack = KazooClient(hosts=hosts, client_id=zk.client_id)
        hijack.start(timeout=10)
        close_client(hijack)

    async def run() -> None:
        server = await DirectClient.connect(hosts)
        client = await DirectClient.connect(hosts)
        try:
            service = await server.serve("quotes", lambda request: b"q:" + request.payload)
            first_znode = service.znode
            assert (await client.request("quotes", b"w", timeout_ms=5_000)).payload == b"q:w"
            subscription = await client.subscribe("ticks.>")
            publisher = await server.start_publisher()
            assert await published_and_received(server, subscription)
            first_publisher = publisher._registration.path if publisher._registration else None
            await asyncio.to_thread(expire, server.zk)
            deadline = time.monotonic() + 20
            while service.znode == first_znode and time.monotonic() < deadline:
                assert (await client.request("quotes", b"x", timeout_ms=5_000)).payload == b"q:x"
                await asyncio.sleep(0.1)
            assert service.znode != first_znode, "the service never registered again"
            assert publisher._registration is not None and publisher._registration.path != first_publisher
            assert (await client.request("quotes", b"y", timeout_ms=5_000)).payload == b"q:y"
            while await subscription.next(timeout_ms=10) is not None:
                pass
            await asyncio.sleep(1.0)  # the subscriber's watch sees the publisher's new znode
            assert await published_and_received(server, subscription), "the subscriber lost the publisher"
        finally:
            await client.close()
            await server.close()

    asyncio.run(run())


def test_blocking_request_ends_when_the_client_closes(zk_server: LocalZooKeeper) -> None:
    bootstrap = f"zk://{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"
    outcome: list[BaseException] = []
    with sdk.Client(bootstrap) as server:
        server.serve("sleepy", lambda request: time.sleep(2.0), concurrency=1)
        client = sdk.Client(bootstrap)

        def call() -> None:
            try:
                client.request("sleepy", b"x", timeout_ms=10_000)
            except errors.FabricError as exc:
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(0.5)
        began = time.monotonic()
        client.close()
        caller.join(10)
        assert not caller.is_alive() and time.monotonic() - began < 5.0
        assert len(outcome) == 1 and isinstance(outcome[0], errors.ClientClosedError)
        with pytest.raises(errors.ClientClosedError):
            client.request("sleepy", b"x")


def test_a_wildcard_bind_registers_an_address_others_can_reach(zk_server: LocalZooKeeper) -> None:
    hosts = f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"

    async def run() -> None:
        server = await DirectClient.connect(hosts, publisher_bind="tcp://0.0.0.0:*")
        client = await DirectClient.connect(hosts)
        try:
            wide = await server.serve("wide", lambda request: b"wide", bind="tcp://0.0.0.0:*")
            assert wide.address.startswith("tcp://127.0.0.1:")  # the route to ZooKeeper (on loopback here)
            named = await server.serve("named", lambda request: b"named", bind="tcp://0.0.0.0:*", advertise="localhost")
            assert named.address.startswith("tcp://localhost:")
            assert (await client.request("wide", b"", timeout_ms=5_000)).payload == b"wide"
            assert (await client.request("named", b"", timeout_ms=5_000)).payload == b"named"
            publisher = await server.start_publisher()
            assert publisher.address.startswith("tcp://127.0.0.1:")
            assert registry.advertised_address("tcp://10.1.2.3:5000", server.zk, "203.0.113.7") == "tcp://203.0.113.7:5000"
        finally:
            await client.close()
            await server.close()

    asyncio.run(run())


def test_blocking_requests_from_short_lived_threads_do_not_leak_sockets(zk_server: LocalZooKeeper) -> None:
    bootstrap = f"zk://{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"
    with sdk.Client(bootstrap) as server, sdk.Client(bootstrap) as client:
        server.serve("echo", lambda request: request.payload)
        answers: list[bytes] = []
        for n in range(300):  # a thread per request, as a threading HTTP server does
            thread = threading.Thread(target=lambda n=n: answers.append(client.request("echo", str(n)).payload))
            thread.start()
            thread.join()
        assert sorted(answers) == sorted(str(n).encode() for n in range(300))
        assert client.direct._blocking.sockets_open <= 130  # ended threads' sockets are closed


def test_an_oversized_reply_is_refused_and_the_connection_survives(zk_server: LocalZooKeeper) -> None:
    """A frame past ZMQ_MAXMSGSIZE would make the caller drop the connection (and every
    request pipelined on it): the instance answers with an error instead."""
    from fabric.protocol import direct as wire

    hosts = f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"

    async def run() -> None:
        server = await DirectClient.connect(hosts)
        client = await DirectClient.connect(hosts)
        try:
            await server.serve("sizes", lambda request: b"x" * int(request.payload))
            with pytest.raises(errors.InvalidRequestError, match="payload is"):
                await client.request("sizes", str(wire.PAYLOAD_BYTES_MAX + 1), timeout_ms=10_000)
            assert (await client.request("sizes", b"3", timeout_ms=5_000)).payload == b"xxx"
            with pytest.raises(errors.InvalidRequestError):  # and a caller never sends one
                await client.request("sizes", b"x" * (wire.PAYLOAD_BYTES_MAX + 1), timeout_ms=5_000)
        finally:
            await client.close()
            await server.close()

    asyncio.run(run())


def test_async_consumer_in_a_group(cluster: LocalCluster, topic_name: str) -> None:
    with sdk.Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)

    async def run() -> list[bytes]:
        client = await sdk.connect(cluster.bootstrap)
        try:
            producer = client.producer(linger_ms=1)
            await asyncio.gather(*[producer.send(topic_name, f"g{n}", key=f"k{n}") for n in range(10)])
            consumer = await client.consumer([topic_name], group_id=f"group-{topic_name}", enable_auto_commit=False)
            seen: list[bytes] = []
            async for record in consumer:
                seen.append(record.value or b"")
                if len(seen) == 10:
                    break
            # Without auto commit, the asyncio consumer commits itself (it had no commit()).
            assert len(await consumer.assignment()) == 2
            await consumer.commit({TopicPartition(topic_name, 0): 1})
            assert await consumer.committed(TopicPartition(topic_name, 0)) == 1
            await consumer.commit()  # what was handed out, up to the record the loop stopped at
            return seen
        finally:
            await client.close()

    assert sorted(asyncio.run(run())) == sorted(f"g{n}".encode() for n in range(10))


def test_async_client_shares_one_producer_per_set_of_options(cluster: LocalCluster, topic_name: str) -> None:
    with sdk.Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)

    async def run() -> None:
        client = await sdk.connect(cluster.bootstrap)
        try:
            threads = threading.active_count()
            for n in range(10):  # the README's one-liner in a loop: one producer, not ten
                await client.producer().send(topic_name, f"{n}")
            assert threading.active_count() <= threads + 1
            assert client.producer() is client.producer() and client.producer(linger_ms=7) is not client.producer()
            first = client.producer()
            await first.close()
            replaced = client.producer()
            assert replaced is not first and not replaced.closed
            assert (await replaced.send(topic_name, b"after")).offset == 10
        finally:
            await client.close()

    asyncio.run(run())


def test_async_client_after_close_and_a_cancelled_group_consumer(cluster: LocalCluster, topic_name: str) -> None:
    """A group consumer whose creation was cancelled (asyncio.wait_for) left an orphan
    member holding the group's partitions for its session; after close() the client made
    new producers and consumers that nothing would close."""
    with sdk.Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    group = f"g-{topic_name}"

    async def run() -> None:
        client = await sdk.connect(cluster.bootstrap)
        for delay_s in (0.001, 0.05, 0.2, 0.5):  # some cancel the creation, some the subscribe
            try:
                consumer = await asyncio.wait_for(client.consumer([topic_name], group_id=group,
                                                                  session_timeout_ms=30_000), delay_s)
            except asyncio.TimeoutError:
                continue
            await consumer.close()
        with sdk.Admin(cluster.bootstrap) as admin:

            def members() -> int:
                try:
                    return len(admin.describe_group(group).members)
                except errors.GroupIdNotFoundError:
                    return 0  # nobody ever joined
            deadline = time.monotonic() + 10
            while members() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert not members()  # no orphan holds the partitions (the session is 30 s)
        await client.close()
        with pytest.raises(errors.ClientClosedError):
            client.producer()
        with pytest.raises(errors.ClientClosedError):
            await client.consumer([topic_name])
        with pytest.raises(errors.ClientClosedError):
            await client.queue_consumer(topic_name)

    asyncio.run(run())


def test_async_client_forgets_the_consumers_their_owners_closed(cluster: LocalCluster, topic_name: str) -> None:
    """A long-lived client making a consumer per task kept every closed one (and its
    Consumer) for ever: 180 made and closed held 180 of each, ~8 KiB apiece."""
    with sdk.Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
        admin.create_queue(f"{topic_name}-q")
    made = 20

    async def run() -> tuple[int, int]:
        client = await sdk.connect(cluster.bootstrap)
        consumers: weakref.WeakSet[Any] = weakref.WeakSet()
        queue_consumers: weakref.WeakSet[Any] = weakref.WeakSet()
        try:
            for _ in range(made):
                consumer = await client.consumer([topic_name])
                consumers.add(consumer)
                await consumer.close()
                queue_consumer = await client.queue_consumer(f"{topic_name}-q")
                queue_consumers.add(queue_consumer)
                await queue_consumer.close()
            del consumer, queue_consumer
            gc.collect()
            return len(consumers), len(queue_consumers)
        finally:
            await client.close()

    kept, queue_kept = asyncio.run(run())
    assert kept <= 1 and queue_kept <= 1, (kept, queue_kept)  # the last one, until the next is made


def test_asking_for_a_name_nobody_serves_leaves_nothing_in_zookeeper(zk_server: LocalZooKeeper) -> None:
    """A caller used to create the service's znode to watch it: every name ever asked for
    (a typo, `fabric request` of anything) stayed in ZooKeeper as an empty znode for good.
    It now watches for the znode to appear, and finds a service that starts later."""
    chroot = f"/direct-{uuid.uuid4().hex[:10]}"
    bootstrap = f"zk://{zk_server.address}{chroot}"
    with sdk.Client(bootstrap) as client:
        for name in ("nobody-serves-this", "nor-this", "late"):
            with pytest.raises(errors.NoServiceAvailable):
                client.request(name, b"x", timeout_ms=300)
        with sdk.Client(bootstrap) as server:
            server.serve("late", lambda request: b"pong:" + request.payload)
            with pytest.raises(errors.NoServiceAvailable):
                client.request("not-late", b"x", timeout_ms=300)
            deadline = time.monotonic() + 10
            reply = None
            while reply is None and time.monotonic() < deadline:
                try:
                    reply = client.request("late", b"hi", timeout_ms=1_000)
                except errors.NoServiceAvailable:
                    time.sleep(0.1)
            assert reply is not None and reply.payload == b"pong:hi"
    zk = registry.start_client(f"{zk_server.address}{chroot}")
    try:
        services = set(zk.get_children(registry.service_path("late").rsplit("/", 1)[0]))
    finally:
        zk.stop()
        zk.close()
    # "late" is a container whose instance has gone: ZooKeeper may have reaped it already.
    assert services <= {"late"}, services

"""Queue-mode regressions found by an audit of the SDK against docs/QUEUES.md: what a
worker written from the docs alone meets first (close(), run(), asyncio, bad arguments)."""

from __future__ import annotations

import time
from pathlib import Path

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin, Producer, QueueConsumer
from tests.conftest import make_cluster


def _send(bootstrap: str, queue: str, values: list[bytes]) -> None:
    with Producer(bootstrap, linger_ms=1) as producer:
        for f in [producer.send(queue, v) for v in values]:
            f.result(timeout=30)


def test_close_gives_back_unhanded_messages_without_counting_a_delivery(cluster: LocalCluster, topic_name: str) -> None:
    """docs/QUEUES.md: a loop left early leaves the rest with the consumer and close() gives
    them back (visible again). They never reached the application: close() must not count
    a delivery for them, so with max_deliveries=1 they were dead-lettered unhandled."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1, max_deliveries=1, dead_letter=f"{topic_name}.dlq")
    _send(cluster.bootstrap, topic_name, [f"m{i}".encode() for i in range(10)])
    worker = QueueConsumer(cluster.bootstrap, topic_name, "workers")
    for msg in worker:  # iteration takes up to 10 from the nodes, hands out one
        worker.ack(msg)
        break
    worker.close()
    with Admin(cluster.bootstrap) as admin:
        desc = admin.describe_queue(topic_name, "workers")
        assert (desc.total("visible"), desc.total("in_flight"), desc.total("dead_lettered")) == (9, 0, 0)
    with QueueConsumer(cluster.bootstrap, topic_name, "workers") as again:
        got: list = []
        deadline = time.monotonic() + 20
        while len(got) < 9 and time.monotonic() < deadline:
            got += again.receive(10, 500)
        assert sorted(m.value for m in got) == sorted(f"m{i}".encode() for i in range(1, 10))
        assert {m.delivery_count for m in got} == {1}  # the first delivery the application sees
        again.ack(got)


def test_run_acks_before_a_batch_outlives_its_leases_and_survives_a_lost_lease(
        cluster: LocalCluster, topic_name: str) -> None:
    """run() acked a batch only after its last handler, and raised LeaseNotHeldError out of
    the worker loop when that was past the leases: four 0.6 s handlers under a 2 s lease
    killed the loop and every message came back, although each handler was quick."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1, visibility_timeout_ms=2_000)
    values = [f"m{i}".encode() for i in range(4)]
    _send(cluster.bootstrap, topic_name, values)
    handled: list[bytes] = []

    def handle(msg: object) -> None:
        handled.append(msg.value)  # type: ignore[attr-defined]
        time.sleep(0.6)

    with QueueConsumer(cluster.bootstrap, topic_name, "workers") as worker:
        worker.run(handle, max_messages=4, should_stop=lambda: bool(handled))  # must not raise
        assert handled and handled[0] == b"m0"
        time.sleep(2.5)  # every lease of that batch has ended by now
        again: list = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            batch = worker.receive(10, 300)
            worker.ack(batch)
            again += batch
    # The first handled messages were acked in time: only the tail (if any) comes back.
    assert b"m0" not in {m.value for m in again} and b"m1" not in {m.value for m in again}
    assert sorted(set(handled) | {m.value for m in again}) == values


def test_async_iteration_cancelled_by_wait_for_does_not_strand_a_message(
        cluster: LocalCluster, topic_name: str) -> None:
    """``await asyncio.wait_for(anext(it), t)`` cancels the awaiting task, but the receive
    already running on the consumer's worker goes on and takes the next message from the
    buffer: it was neither handed out nor given back, and came back only after its lease."""
    import asyncio

    from sdk.aio_queue import AsyncQueueConsumer

    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1)  # 30 s visibility timeout

    async def scenario() -> list[bytes]:
        worker = await AsyncQueueConsumer.create(cluster.bootstrap, topic_name, "workers")
        producer = Producer(cluster.bootstrap, linger_ms=1)
        try:
            await worker.receive(1, 0)  # connected, the partition's state loaded
            try:
                await asyncio.wait_for(worker.__aiter__().__anext__(), 0.05)
            except TimeoutError:
                pass  # the worker's long poll (up to 1 s) is still running
            producer.send(topic_name, b"first").result(timeout=30)
            got: list[bytes] = []

            async def take() -> None:
                async for msg in worker:
                    got.append(msg.value or b"")
                    await worker.ack(msg)
                    return
            await asyncio.wait_for(take(), 10)  # not 30 s: the message was kept for the next iteration
            return got
        finally:
            producer.close()
            await worker.close()

    assert asyncio.run(scenario()) == [b"first"]


def test_async_queue_consumer_shared_by_tasks_settles_beside_a_long_poll_and_keeps_cancelled_receives(
        cluster: LocalCluster, topic_name: str) -> None:
    """Three findings of an asyncio audit, one consumer each way a service uses it:
    tasks iterating one AsyncQueueConsumer each get different messages (the same message
    went to two tasks before); an ack does not wait behind another task's long poll (it
    waited until the poll ended, its lease having run out meanwhile); a receive cancelled
    by wait_for leaves what it leased for the next receive, not for its lease to end."""
    import asyncio

    from sdk.aio_queue import AsyncQueueConsumer

    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=2)  # 30 s visibility timeout
    count = 60

    async def scenario() -> None:
        worker = await AsyncQueueConsumer.create(cluster.bootstrap, topic_name, "workers")
        producer = Producer(cluster.bootstrap, linger_ms=1)
        try:
            for i in range(count):
                producer.send(topic_name, b"%d" % i)
            producer.flush(30)
            seen: list[bytes] = []

            async def iterate() -> None:
                async for msg in worker:
                    seen.append(msg.value or b"")
                    await worker.ack(msg)
                    if len(seen) >= count:
                        return

            tasks = [asyncio.ensure_future(iterate()) for _ in range(3)]
            await asyncio.wait_for(_until(lambda: len(seen) >= count), 30)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert sorted(seen) == sorted(b"%d" % i for i in range(count))  # each once

            producer.send(topic_name, b"settle-me").result(timeout=30)
            (msg,) = await worker.receive(1, 5_000)
            polling = asyncio.ensure_future(worker.receive(1, 15_000))  # nothing else to get: waits 15 s
            await asyncio.sleep(0.2)
            await asyncio.wait_for(worker.ack(msg), 10)
            assert not polling.done()  # the ack went past the long poll
            polling.cancel()  # leases nothing (the queue is empty); the worker's poll runs on

            late = asyncio.ensure_future(worker.receive(1, 3_000))
            await asyncio.sleep(0.2)
            late.cancel()
            producer.send(topic_name, b"kept").result(timeout=30)  # the cancelled receives may lease it
            got = await worker.receive(1, 20_000)  # from the buffer they gave it back to, or leased now
            assert [m.value for m in got] == [b"kept"] and got[0].delivery_count == 1
            await worker.ack(got)
        finally:
            producer.close()
            await worker.close()

    asyncio.run(scenario())


async def _until(predicate: object) -> None:
    import asyncio

    while not predicate():  # type: ignore[operator]
        await asyncio.sleep(0.02)


def _drain(bootstrap: str, queue: str, expected: int) -> list[bytes]:
    got: list[bytes] = []
    with QueueConsumer(bootstrap, queue, "workers") as worker:
        deadline = time.monotonic() + 20
        while len(got) < expected and time.monotonic() < deadline:
            batch = worker.receive(10, 500)
            worker.ack(batch)
            got += [m.value for m in batch]
    return got


def test_a_queue_created_again_does_not_inherit_the_deleted_ones_acks(cluster: LocalCluster, topic_name: str) -> None:
    """`fabric queue delete jobs` then `fabric queue create jobs` (QUEUES.md quick start):
    the new queue's leader loaded the old queue's acks from __queue_state (same name, same
    partition, same group), so the new queue's first messages were never delivered, their
    sends acknowledged; receive returned nothing and describe showed 0 visible."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1)
    _send(cluster.bootstrap, topic_name, [b"old-0", b"old-1", b"old-2"])
    assert sorted(_drain(cluster.bootstrap, topic_name, 3)) == [b"old-0", b"old-1", b"old-2"]
    with Admin(cluster.bootstrap) as admin:
        admin.delete_queue(topic_name)
        admin.create_queue(topic_name, partitions=1)
    _send(cluster.bootstrap, topic_name, [b"new-0", b"new-1", b"new-2"])
    assert sorted(_drain(cluster.bootstrap, topic_name, 3)) == [b"new-0", b"new-1", b"new-2"]


def test_a_receive_past_the_parked_limit_is_answered_while_its_partition_loads(
        zk_server: LocalZooKeeper, tmp_path: Path) -> None:
    """With PARKED_RECEIVES_MAX long polls parked on a node, a new receive is answered at
    once, empty if need be. One for a partition still reading its state (a queue's first
    receive) was neither answered nor parked: its caller heard nothing until its own
    timeout."""
    import zmq

    from fabric.protocol import apis
    from fabric.protocol import queues as qp
    from nodes.queue_coordinator import PARKED_RECEIVES_MAX

    def receive(queue: str, wait_ms: int, cid: int) -> list[bytes]:
        return apis.encode_request(apis.ApiKey(qp.API_QUEUE_RECEIVE), {
            "queue": queue, "group": "g", "consumer_id": "c", "partition": 0, "max_messages": 1,
            "wait_ms": wait_ms, "visibility_timeout_ms": 30_000}, cid)

    with make_cluster(zk_server, tmp_path / "c", nodes=1) as cluster, Admin(cluster.bootstrap) as admin:
        admin.create_queue("parked", partitions=1, replication_factor=1)
        admin.create_queue("fresh", partitions=1, replication_factor=1)
        address = next(iter(admin.nodes().values()))
        with QueueConsumer(cluster.bootstrap, "parked", "g") as warm:
            warm.receive(1, 100)  # "parked" has loaded its state: its long polls park
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(address)
        try:
            for cid in range(PARKED_RECEIVES_MAX):
                sock.send_multipart(receive("parked", qp.RECEIVE_WAIT_MS_MAX, cid))
            time.sleep(2)  # all of them parked (an answer now would be the fresh queue's)
            sock.send_multipart(receive("fresh", qp.RECEIVE_WAIT_MS_MAX, 999_999))
            assert sock.poll(10_000), "no answer for the fresh queue's receive"
            reply = apis.decode_response(sock.recv_multipart())
            assert reply.header.correlation_id == 999_999 and reply.body["messages"] == []
        finally:
            sock.close(linger=0)

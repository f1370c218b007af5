"""The public Producer is a thin handle over _ProducerCore: the two must take the same options,
and a handle dropped while its core is in use must not cut the call short."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import sdk.producer
from fabric import errors
from fabric.protocol.apis import ApiKey
from sdk.aio import AsyncProducer
from sdk.producer import ORPHAN_IDLE_S, Producer, _ProducerCore
from tests.unit.test_sdk_hostile_answers import TOPIC, FakeNode


def test_handle_and_core_take_the_same_parameters() -> None:
    handle = inspect.signature(Producer.__init__).parameters
    core = inspect.signature(_ProducerCore.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in handle.values()] == \
        [(p.name, p.kind, p.default) for p in core.values()]


def test_help_shows_the_handles_methods_with_the_cores_docs() -> None:
    import pydoc

    text = pydoc.render_doc(Producer, renderer=pydoc.plaintext)
    for name in ("send", "send_batch", "flush", "partitions_for", "close"):
        assert f" |  {name}(self" in text, name
        assert getattr(Producer, name).__doc__, name
    assert Producer.send.__doc__ == _ProducerCore._send_python.__doc__
    assert "topic: 'str'" in str(inspect.signature(Producer.send))


def test_queue_send_options_become_headers_and_bad_values_raise() -> None:
    from fabric.protocol import queues as q

    now_ms = 1_700_000_000_000
    assert q.read_headers(q.send_headers(delay_ms=5, priority=9, ttl_ms=7, dedup_id="a", now_ms=now_ms)) == {
        "delay_ms": 5, "deliver_at_ms": 0, "priority": 9, "ttl_ms": 7, "dedup_id": "a"}
    with pytest.raises(errors.InvalidPriorityError):
        q.send_headers(priority=10, now_ms=now_ms)
    with pytest.raises(errors.InvalidDelayError):
        q.send_headers(delay_ms=q.SEND_DELAY_MS_MAX + 1, now_ms=now_ms)
    # deliver_at_ms: up to 7 days ahead of the checker's clock; past times are due at once.
    # (A time in microseconds, 1,000 times too far, would hold its message for ever.)
    for at in (1, now_ms - 1, now_ms + q.SEND_DELAY_MS_MAX):
        assert q.read_headers(q.send_headers(deliver_at_ms=at, now_ms=now_ms))["deliver_at_ms"] == at
    for at in (now_ms + q.SEND_DELAY_MS_MAX + 1, now_ms * 1000, -1):
        with pytest.raises(errors.InvalidDelayError, match=r"deliver_at_ms 0\.\.now"):
            q.send_headers(deliver_at_ms=at, now_ms=now_ms)
    with pytest.raises(errors.InvalidDelayError):
        q.check_sent_headers([(q.HEADER_DELIVER_AT_MS, str(now_ms * 1000).encode())], now_ms)
    q.check_sent_headers([(q.HEADER_DELIVER_AT_MS, str(now_ms + 60_000).encode())], now_ms)
    # The wrong type is refused by name, not by a comparison's TypeError (or, for a bool,
    # taken as 0 or 1).
    for bad, name in (({"priority": "5"}, "priority"), ({"delay_ms": 1.5}, "delay_ms"),
                      ({"ttl_ms": True}, "ttl_ms"), ({"deliver_at_ms": "0"}, "deliver_at_ms"),
                      ({"dedup_id": b"x"}, "dedup_id")):
        with pytest.raises(TypeError, match=f"^{name} must be"):
            q.send_headers(**bad, now_ms=now_ms)
    assert "delay_ms" in inspect.signature(Producer.send if hasattr(Producer, "send") else _ProducerCore.send).parameters


SENDER_END_WAIT_S = ORPHAN_IDLE_S + 10  # an orphaned sender ends ORPHAN_IDLE_S after its last work


@pytest.fixture
def node() -> Iterator[FakeNode]:
    """A real ROUTER socket answering METADATA, INIT_PRODUCER_ID and PRODUCE. At the end,
    the sender threads of the producers a test dropped are waited for (each ends on its
    own once idle), so none outlives its test."""
    before = set(threading.enumerate())
    fake = FakeNode()
    try:
        yield fake
    finally:
        for thread in set(threading.enumerate()) - before:
            if thread.name == "fabric-producer-sender":
                thread.join(SENDER_END_WAIT_S)
                assert not thread.is_alive(), "a dropped producer's sender thread did not end"
        fake.close()


def test_a_send_on_a_temporary_producer_is_delivered(node: FakeNode) -> None:
    """``Producer(...).send(...).result()``, as ``KafkaProducer().send(t, v).get()``: nothing
    references the handle once send is looked up, so it is collected before the call. Its
    core closed at once then, refusing the send the caller was making; now it is orphaned
    and delivers (asyncio.to_thread is where a user met it)."""
    assert Producer(node.address).send(TOPIC, b"v").result(10).offset == 7
    assert Producer(node.address).send_batch(TOPIC, [b"a", b"b"]).result(10)
    assert asyncio.run(asyncio.to_thread(lambda: Producer(node.address).send(TOPIC, b"v").result(10))).offset == 7

    async def temporary_async_producer() -> int:
        # The AsyncProducer and its handle go once send() returns; the record still arrives
        # (and the loop is not held up: a collected handle used to flush on the loop's thread).
        return (await AsyncProducer(Producer(node.address)).send(TOPIC, b"v")).offset

    assert asyncio.run(temporary_async_producer()) == 7


# ORPHAN_IDLE_S for the tests that wait it out: the rule, not the second. A handle has no
# reference cycle, so `del` collects it at once and no gc.collect() is called: in a large
# test process a full collection can take a good part of a short grace (a run with 0.3 s
# and a gc.collect() there once failed, its send refused, in the whole unit suite).
SHORT_IDLE_S = 0.5


def test_a_dropped_producer_stops_its_thread_once_idle_and_then_refuses_with_why(
        monkeypatch: pytest.MonkeyPatch, node: FakeNode) -> None:  # node (its teardown) inside the patch
    """The handle's promise: dropping the last reference stops the sender thread, after
    ORPHAN_IDLE_S without work (not at once: a send already looked up is still coming), and
    a later send through a kept bound method says why it is refused."""
    monkeypatch.setattr(sdk.producer, "ORPHAN_IDLE_S", SHORT_IDLE_S)
    producer = Producer(node.address, acks=1)
    thread = producer._core._thread
    send = producer.send
    started = time.monotonic()
    del producer  # the last reference: the handle is collected here
    assert thread.is_alive()
    time.sleep(SHORT_IDLE_S / 5)
    assert send(TOPIC, b"late but within the grace").result(10).offset == 7  # the idle time starts again
    thread.join(SENDER_END_WAIT_S)
    assert not thread.is_alive()
    assert time.monotonic() - started >= SHORT_IDLE_S * 1.2
    with pytest.raises(errors.ClientClosedError, match=r"garbage-collected.*ORPHAN_IDLE_S=.*keep a reference"):
        send(TOPIC, b"v")


def test_an_orphaned_producer_waits_for_a_send_that_awaits_metadata(
        monkeypatch: pytest.MonkeyPatch, node: FakeNode) -> None:  # node (its teardown) inside the patch
    """A send waiting for a new topic's metadata has nothing in the buffer yet: the
    orphaned core must not close under it, however long the metadata takes."""
    monkeypatch.setattr(sdk.producer, "ORPHAN_IDLE_S", SHORT_IDLE_S)
    new_topic = "t-new"  # not in the map the producer reads first: send() must ask for it
    metadata = node.sane
    answering = threading.Event()

    def slow_metadata(request: Any) -> list[Any]:
        if new_topic in (request.body["topics"] or ()):
            answering.wait(10)
        return [node.answer(request, metadata(request))]

    node.handlers[ApiKey.METADATA] = slow_metadata
    producer = Producer(node.address, acks=1)
    send = producer.send
    del producer
    timer = threading.Timer(SHORT_IDLE_S * 2, answering.set)
    timer.start()
    try:
        assert send(new_topic, b"v").result(10).offset == 7
    finally:
        timer.cancel()

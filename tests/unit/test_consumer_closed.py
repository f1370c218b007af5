"""A closed Consumer refuses every call that reads or changes its partitions, as poll does
(and Kafka's consumer): assign() and position() used to go on working after close()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fabric import errors
from fabric.local import free_port
from sdk import Consumer, TopicPartition

TP = TopicPartition("t", 0)
CALLS: list[tuple[str, Callable[[Consumer], Any]]] = [
    ("assign", lambda c: c.assign([TP])),
    ("subscribe", lambda c: c.subscribe(["t"])),
    ("unsubscribe", lambda c: c.unsubscribe()),
    ("commit", lambda c: c.commit({TP: 1})),
    ("commit_async", lambda c: c.commit_async({TP: 1})),
    ("committed", lambda c: c.committed(TP)),
    ("seek", lambda c: c.seek(TP, 0)),
    ("seek_to_beginning", lambda c: c.seek_to_beginning(TP)),
    ("seek_to_end", lambda c: c.seek_to_end(TP)),
    ("offsets_for_times", lambda c: c.offsets_for_times({TP: 0})),
    ("beginning_offsets", lambda c: c.beginning_offsets([TP])),
    ("end_offsets", lambda c: c.end_offsets([TP])),
    ("position", lambda c: c.position(TP)),
    ("pause", lambda c: c.pause(TP)),
    ("resume", lambda c: c.resume(TP)),
    ("subscribe_all_partitions", lambda c: c.subscribe_all_partitions("t")),
    ("poll", lambda c: c.poll(timeout_ms=0)),
]


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[name for name, _ in CALLS])
def test_a_closed_consumer_refuses(name: str, call: Callable[[Consumer], Any]) -> None:
    consumer = Consumer(f"tcp://127.0.0.1:{free_port()}", group_id="g")
    consumer.close()
    with pytest.raises(errors.ClientClosedError, match=f"{name}.* after close"):
        call(consumer)
    consumer.close()  # a second close does nothing


def test_commit_async_refuses_a_callback_that_is_not_callable_before_it_commits() -> None:
    # It committed first (a node was asked) and only then raised calling it; no node here:
    # the TypeError must come before any request.
    consumer = Consumer(f"tcp://127.0.0.1:{free_port()}", group_id="g")
    try:
        with pytest.raises(TypeError, match="callback must be callable"):
            consumer.commit_async({TP: 7}, callback=5)
    finally:
        consumer.close()

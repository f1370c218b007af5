"""A rebalance listener's hooks are called, never awaited (on the consumer's thread; the
asyncio consumer's worker has no loop): an ``async def`` hook only made a coroutine nobody
ran, silently. subscribe() refuses such a listener before it joins the group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fabric.local import free_port
from sdk import Consumer, ConsumerRebalanceListener, TopicPartition


class AsyncAssigned(ConsumerRebalanceListener):
    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:  # type: ignore[override]
        pass


class AsyncRevokedAndLost(ConsumerRebalanceListener):
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:  # type: ignore[override]
        pass

    async def on_partitions_lost(self, lost: list[TopicPartition]) -> None:  # type: ignore[override]
        pass


@pytest.fixture
def consumer() -> Iterator[Consumer]:
    made = Consumer(f"tcp://127.0.0.1:{free_port()}", group_id="g")  # nobody listens: nothing may be sent
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize(("listener", "named"), [
    (AsyncAssigned(), ["on_partitions_assigned"]),
    (AsyncRevokedAndLost(), ["on_partitions_revoked", "on_partitions_lost"]),
])
def test_subscribe_refuses_a_listener_with_an_async_hook(consumer: Consumer, listener: ConsumerRebalanceListener,
                                                         named: list[str]) -> None:
    with pytest.raises(TypeError, match="async def") as refused:
        consumer.subscribe(["t"], listener=listener)
    for hook in named:
        assert hook in str(refused.value)
    assert consumer.assignment() == [] and not consumer._group.subscribed  # type: ignore[union-attr]

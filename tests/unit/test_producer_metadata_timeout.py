"""A send() that waited max_block_ms for a topic's metadata says why it got none.

A developer pointed a producer at a cluster whose ZooKeeper was down: send() raised
RequestTimedOutError "no metadata for topic 'x' within max_block_ms", and the cause
(ZooKeeper did not answer) was only in a log warning. The error now carries the last
metadata refresh's failure, or says that nothing has answered from the bootstrap yet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fabric import errors
from fabric.local import free_port
from sdk.producer import _ProducerCore
from tests.unit.test_producer_inputs import close_from_another_thread


class _ZooKeeperDown:
    """What MetadataClient.refresh raises while ZooKeeper does not answer."""

    def refresh(self, *args: object, **kwargs: object) -> None:
        raise errors.NoBrokersAvailableError("ZooKeeper 127.0.0.1:1 did not answer within 5.0 s: Connection time-out")


@pytest.fixture
def core() -> Iterator[_ProducerCore]:
    """A producer whose sender thread has stopped (after its first refresh, which fails:
    nobody listens at the bootstrap), so the test alone decides what the refreshes found."""
    made = _ProducerCore(f"tcp://127.0.0.1:{free_port()}", acks=1, max_block_ms=200, retry_backoff_ms=1)
    made._stop.set()
    made._wake()
    made._thread.join(10)
    assert not made._thread.is_alive()
    with made._lock:
        made._metadata_error, made._map_read = None, False  # as before any refresh ended
    try:
        yield made
    finally:
        close_from_another_thread(made)


def test_the_timeout_says_nothing_answered_yet_then_names_the_last_refresh_error(core: _ProducerCore) -> None:
    with pytest.raises(errors.RequestTimedOutError) as first:
        core.send("x", b"v")
    assert "within max_block_ms=200" in first.value.message
    assert "no routing map read yet" in first.value.message and "tcp://127.0.0.1:" in first.value.message

    core._refresh_metadata(_ZooKeeperDown())  # type: ignore[arg-type]
    with pytest.raises(errors.RequestTimedOutError) as later:
        core.send("x", b"v")
    assert "last metadata error: [NO_NODES_AVAILABLE] ZooKeeper 127.0.0.1:1 did not answer" in later.value.message

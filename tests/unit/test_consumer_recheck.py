"""A fetch that outlived its wait makes the consumer ask where its partitions are led
now, and not the silent leader itself: a SIGSTOPped leader would hold that metadata
request, and so a ``poll(timeout_ms=200)``, for a whole metadata timeout (about 5 s, seen
in a fault run). The cluster is not needed to check whom the consumer asks."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from fabric.local import free_port
from sdk import Consumer


def test_the_recheck_avoids_the_leaders_that_went_silent() -> None:
    consumer = Consumer(f"tcp://127.0.0.1:{free_port()}")
    asked: list[set[str]] = []

    class Metadata:
        metadata = consumer._meta.metadata

        def refresh(self, topics: list[str] | None = None, *, avoid: Iterable[str] = (), **_: Any) -> Any:
            asked.append(set(avoid))
            return self.metadata

    try:
        consumer._meta = Metadata()  # type: ignore[assignment]
        now = time.monotonic()
        consumer._in_flight[1] = ("tcp://10.0.0.9:1", now - 60, {}, 0)  # silent for a minute
        consumer._in_flight[2] = ("tcp://10.0.0.8:1", now, {}, 0)  # just sent
        consumer._last_recheck_s = 0.0
        consumer._check_timeouts()
        assert asked == [{"tcp://10.0.0.9:1"}]
    finally:
        consumer._in_flight.clear()
        consumer.close()

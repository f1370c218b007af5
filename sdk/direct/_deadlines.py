"""Request timeouts without a loop timer per request.

A timer per request (``loop.call_later`` then ``cancel``) costs a heap push, a cancelled
handle left in the heap and its later clean-up: a visible share of a request at tens of
thousands per second. Requests with the same attempt duration expire in the order they
were sent, so each duration (in whole milliseconds) keeps a FIFO lane and one loop timer
for its head; a reply costs nothing here (a finished future is skipped when its turn
comes). Lanes are compacted when finished entries pile up, so memory stays bounded by
twice the requests in flight plus ``COMPACT_MIN`` per lane.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

COMPACT_MIN = 1_024  # entries a lane may hold before finished ones are swept out


class _Lane:
    __slots__ = ("compact_at", "entries", "timer")

    def __init__(self) -> None:
        self.entries: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self.timer: asyncio.TimerHandle | None = None
        self.compact_at = COMPACT_MIN


class Deadlines:
    """Fails futures with ``asyncio.TimeoutError`` once their duration has passed (up to a
    millisecond late: durations are grouped by whole milliseconds). Loop thread only."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lanes: dict[int, _Lane] = {}

    def add(self, future: asyncio.Future[Any], duration_s: float) -> None:
        key = int(duration_s * 1000)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        deadline_s = self._loop.time() + duration_s
        lane.entries.append((deadline_s, future))
        if lane.timer is None:
            lane.timer = self._loop.call_at(deadline_s, self._expire, key)
        elif len(lane.entries) > lane.compact_at:
            lane.entries = deque(entry for entry in lane.entries if not entry[1].done())
            lane.compact_at = max(COMPACT_MIN, 2 * len(lane.entries))

    def _expire(self, key: int) -> None:
        lane = self._lanes[key]
        lane.timer = None
        now = self._loop.time()
        entries = lane.entries
        while entries:
            deadline_s, future = entries[0]
            if not future.done():
                if deadline_s > now:
                    lane.timer = self._loop.call_at(deadline_s, self._expire, key)
                    return
                future.set_exception(asyncio.TimeoutError())
            entries.popleft()
        del self._lanes[key]

    def close(self) -> None:
        for lane in self._lanes.values():
            if lane.timer is not None:
                lane.timer.cancel()
        self._lanes.clear()

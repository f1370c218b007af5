"""Request timeouts grouped in lanes (sdk.direct._deadlines), with an injected clock: a fake
loop whose time the test sets and whose timers the test fires."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from sdk.direct import _deadlines
from sdk.direct._deadlines import Deadlines


class FakeTimer:
    def __init__(self, loop: FakeLoop, timer: tuple[float, Callable[..., None], tuple[Any, ...]]) -> None:
        self._loop = loop
        self._timer = timer

    def cancel(self) -> None:
        if self._timer in self._loop.timers:
            self._loop.timers.remove(self._timer)


class FakeLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[..., None], tuple[Any, ...]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> FakeTimer:
        timer = (when, callback, args)
        self.timers.append(timer)
        return FakeTimer(self, timer)

    def advance(self, to: float) -> None:
        """Run every timer due by ``to``, in order, as the loop would."""
        self.now = to
        while True:
            due = sorted((t for t in self.timers if t[0] <= to), key=lambda t: t[0])
            if not due:
                return
            self.timers.remove(due[0])
            due[0][1](*due[0][2])


@pytest.fixture
def real_loop() -> Any:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_futures_expire_in_order_and_answered_ones_are_left_alone(real_loop: asyncio.AbstractEventLoop) -> None:
    fake = FakeLoop()
    deadlines = Deadlines(fake)  # type: ignore[arg-type]
    first, answered, later = (real_loop.create_future() for _ in range(3))
    deadlines.add(first, 0.1)
    fake.now = 0.05
    deadlines.add(answered, 0.1)
    deadlines.add(later, 0.2)  # another lane
    answered.set_result("reply")
    fake.advance(0.1)
    assert isinstance(first.exception(), TimeoutError)
    assert not later.done()
    fake.advance(0.15)
    assert answered.result() == "reply"  # untouched when its turn came
    fake.advance(0.25)
    assert isinstance(later.exception(), TimeoutError)
    assert not fake.timers and not deadlines._lanes  # nothing left behind


def test_a_lane_is_compacted_when_answered_entries_pile_up(real_loop: asyncio.AbstractEventLoop) -> None:
    fake = FakeLoop()
    deadlines = Deadlines(fake)  # type: ignore[arg-type]
    for _ in range(_deadlines.COMPACT_MIN * 3):
        future = real_loop.create_future()
        deadlines.add(future, 5.0)
        future.set_result(None)  # answered at once, as at high request rates
    (lane,) = deadlines._lanes.values()
    assert len(lane.entries) <= _deadlines.COMPACT_MIN + 1
    deadlines.close()
    assert not deadlines._lanes and not fake.timers

"""The sequencer's warnings about failed ZooKeeper calls name the error: kazoo's
ConnectionLoss and timeouts have no message, and "could not register as active: " (with
nothing after it) was all a fault test's sequencer log said during a ZooKeeper pause."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

from sequencer.service import SequencerService


class _Failing:
    def get(self, timeout: float | None = None) -> Any:
        raise ConnectionLoss()


class _Zk:
    def create_async(self, *_args: Any, **_kwargs: Any) -> _Failing:
        return _Failing()


def test_a_failed_registration_names_the_error(caplog: pytest.LogCaptureFixture) -> None:
    service = SequencerService("127.0.0.1:1", 1)
    try:
        service.zk = _Zk()  # type: ignore[assignment]
        with caplog.at_level(logging.WARNING):
            service._try_become_active()
    finally:
        service.router.close(linger=0)
        service.ctx.term()
    assert "could not register as active: ConnectionLoss" in caplog.text

"""The public Producer is a thin handle over _ProducerCore: the two must take the same options."""

from __future__ import annotations

import inspect

from sdk.producer import Producer, _ProducerCore


def test_handle_and_core_take_the_same_parameters() -> None:
    handle = inspect.signature(Producer.__init__).parameters
    core = inspect.signature(_ProducerCore.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in handle.values()] == \
        [(p.name, p.kind, p.default) for p in core.values()]


def test_queue_send_options_become_headers_and_bad_values_raise() -> None:
    import pytest

    from fabric import errors
    from fabric.protocol import queues as q

    assert q.read_headers(q.send_headers(delay_ms=5, priority=9, ttl_ms=7, dedup_id="a")) == {
        "delay_ms": 5, "deliver_at_ms": 0, "priority": 9, "ttl_ms": 7, "dedup_id": "a"}
    with pytest.raises(errors.InvalidPriorityError):
        q.send_headers(priority=10)
    with pytest.raises(errors.InvalidDelayError):
        q.send_headers(delay_ms=q.SEND_DELAY_MS_MAX + 1)
    # The wrong type is refused by name, not by a comparison's TypeError (or, for a bool,
    # taken as 0 or 1).
    for bad, name in (({"priority": "5"}, "priority"), ({"delay_ms": 1.5}, "delay_ms"),
                      ({"ttl_ms": True}, "ttl_ms"), ({"deliver_at_ms": "0"}, "deliver_at_ms"),
                      ({"dedup_id": b"x"}, "dedup_id")):
        with pytest.raises(TypeError, match=f"^{name} must be"):
            q.send_headers(**bad)
    assert "delay_ms" in inspect.signature(Producer.send if hasattr(Producer, "send") else _ProducerCore.send).parameters

"""The public Producer is a thin handle over _ProducerCore: the two must take the same options."""

from __future__ import annotations

import inspect

from sdk.producer import Producer, _ProducerCore


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
    import pytest

    from fabric import errors
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


def test_a_send_on_a_collected_handle_says_why_it_was_refused() -> None:
    """``Producer(...).send(...)``: nothing references the handle once send is looked up,
    so it is collected (and its core closed) before the call; the error must say that,
    not a bare 'send() after close()' the caller never made."""
    import pytest

    from fabric import errors

    with pytest.raises(errors.ClientClosedError, match=r"garbage-collected.*keep a reference"):
        Producer("tcp://127.0.0.1:1").send("t", b"v")  # no node there: nothing is sent either way

"""One logging setup: text by default, JSON on request, context fields on replica lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from fabric import logs


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_text_lines_carry_process_partition_and_epoch(restore_root: None) -> None:
    out = io.StringIO()
    logs.setup("INFO", "text", process="node2", node_id=2, stream=out)
    replica = logs.replica_logger(logging.getLogger("logtest.replication"), topic="events", partition=3, epoch=7)
    replica.info("truncated to %d", 1200)
    logging.getLogger("fabric.node").debug("not shown at INFO")
    line = out.getvalue().strip()
    assert "\n" not in line
    assert line.endswith(" node2 INFO logtest.replication [events/3 epoch=7] truncated to 1200")
    assert line[:4].isdigit() and line[23] == "Z"  # 2026-11-22T20:51:02.114Z


def test_json_lines_are_objects_with_context_fields(restore_root: None) -> None:
    out = io.StringIO()
    logs.setup("debug", "json", process="node1", node_id=1, stream=out)
    replica = logs.replica_logger(logging.getLogger("logtest.replication"), topic="t", partition=0, epoch=4)
    replica.warning("follower %d left the ISR", 3, extra={"follower": 3})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("thirdparty.client").exception("third-party line")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["level"] == "WARNING" and first["process"] == "node1" and first["node"] == 1
    assert (first["topic"], first["partition"], first["epoch"], first["follower"]) == ("t", 0, 4, 3)
    assert first["msg"] == "follower 3 left the ISR"
    assert second["logger"] == "thirdparty.client" and "RuntimeError: boom" in second["exc"]


def test_setup_twice_leaves_one_handler(restore_root: None) -> None:
    logs.setup("INFO", "text", stream=io.StringIO())
    logs.setup("INFO", "json", stream=io.StringIO())
    assert len(logging.getLogger().handlers) == 1


def test_bad_choices_are_refused() -> None:
    with pytest.raises(ValueError, match="log format"):
        logs.formatter("xml")
    with pytest.raises(ValueError, match="log level"):
        logs.setup("chatty", stream=io.StringIO())
    with pytest.raises(ValueError, match="unknown log context"):
        logs.context_logger(logging.getLogger("x"), partiton=1)


def test_kazoos_reconnection_lines_are_held_to_one_per_interval(restore_root: None) -> None:
    """ZooKeeper down: kazoo logs two lines per attempt, about one attempt a second. One
    of each per interval is written, with the count held back since; other lines pass."""
    now = [0.0]
    stream = io.StringIO()
    handler = logs.setup("INFO", process="node1", stream=stream)
    for f in list(handler.filters):
        if isinstance(f, logs._KazooRepeats):
            handler.removeFilter(f)
    handler.addFilter(logs._KazooRepeats(interval_s=10.0, clock=lambda: now[0]))
    # Records straight to the handler: logger levels are process-wide, and CLI tests run
    # in this process quiet the "kazoo" logger.
    def record(name: str, level: int, msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 0, msg, args, None)

    for second in range(25):
        now[0] = float(second)
        handler.handle(record("kazoo.client", logging.WARNING, "Connection dropped: socket connection error: %s",
                              "Connection refused"))
        handler.handle(record("fabric.node", logging.WARNING, "still here %d", second))
    handler.handle(record("kazoo.client", logging.ERROR, "Connection dropped: socket connection error: %s",
                          "Connection refused"))  # errors always pass
    lines = stream.getvalue().splitlines()
    dropped = [line.split("kazoo.client ", 1)[1] for line in lines if "kazoo.client" in line]
    assert dropped == ["Connection dropped: socket connection error: Connection refused",
                       "Connection dropped: socket connection error: Connection refused (9 more like this in the last 10 s)",
                       "Connection dropped: socket connection error: Connection refused (9 more like this in the last 10 s)",
                       "Connection dropped: socket connection error: Connection refused"]
    assert sum("still here" in line for line in lines) == 25

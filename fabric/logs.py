"""One logging setup for every Fabric process: nodes, the sequencer, services, the CLI.

    from fabric import logs
    logs.setup(level="INFO", log_format="text", process="node1", node_id=1)
    log = logs.replica_logger(logging.getLogger("fabric.replication"), topic="events", partition=3, epoch=7)
    log.info("truncated to %d", 1200)

Text (the default) is for people reading a terminal::

    2026-11-22T20:51:02.114Z node1 INFO fabric.replication [events/3 epoch=7] truncated to 1200

JSON (``--log-format json``) is one object per line, for Loki, Elasticsearch or ``jq``::

    {"ts": "2026-11-22T20:51:02.114Z", "level": "INFO", "logger": "fabric.replication",
     "process": "node1", "node": 1, "topic": "events", "partition": 3, "epoch": 7,
     "msg": "truncated to 1200"}

Context travels as ``extra`` fields on the log record (the stdlib ``LoggerAdapter``
convention), so a line about a partition carries ``topic``, ``partition`` and ``epoch``
as fields, not only inside the text. ``setup`` stamps ``node`` on every record.

Why no library (structlog, python-json-logger): the stdlib ``logging.Formatter`` does all
of this in a few dozen lines, formats the records of third-party loggers (kazoo) the same
way without adapters, and keeps the core free of another dependency.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import IO, Any, Final

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Record attributes that are context, in the order they are printed.
CONTEXT_FIELDS = ("node", "topic", "partition", "epoch", "follower", "group", "queue", "service")
# The partition context printed between brackets in text lines.
_TEXT_CONTEXT = ("follower", "group", "queue", "service")
# kazoo's repeated lines (see _KazooRepeats): one of each per interval.
KAZOO_REPEAT_INTERVAL_S: Final[float] = 10.0
_KAZOO_MESSAGES_TRACKED_MAX: Final[int] = 256


def _utc_timestamp(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


class _ProcessFields(logging.Filter):
    """Stamps the process name and node id on every record that passes the handler."""

    def __init__(self, process: str, node_id: int | None) -> None:
        super().__init__()
        self.process = process
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.process_name = self.process
        if self.node_id is not None and not hasattr(record, "node"):
            record.node = self.node_id
        return True


class _KazooRepeats(logging.Filter):
    """kazoo logs every reconnection attempt, a "Connecting to" and a "Connection dropped"
    line each, backing off to about one a second: with ZooKeeper down for the 30 s a node
    or sequencer waits at start, 60 such lines came before the one line saying why it
    could not start, and a cluster that lost ZooKeeper for an hour logged thousands. The
    same kazoo message (below ERROR) passes at most once per ``interval_s``, with how many
    were held back since; everything else passes untouched."""

    def __init__(self, interval_s: float = KAZOO_REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()  # kazoo logs from its own threads
        self._seen: dict[str, tuple[float, int]] = {}  # message -> (last passed, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("kazoo") or record.levelno >= logging.ERROR:
            return True
        message = record.getMessage()
        now = self._clock()
        with self._lock:
            seen = self._seen.get(message)
            if seen is not None and now - seen[0] < self._interval_s:
                self._seen[message] = (seen[0], seen[1] + 1)
                return False
            self._seen.pop(message, None)
            self._seen[message] = (now, 0)
            while len(self._seen) > _KAZOO_MESSAGES_TRACKED_MAX:
                del self._seen[next(iter(self._seen))]
        if seen is not None and seen[1]:
            record.msg, record.args = f"{message} ({seen[1]} more like this in the last {now - seen[0]:.0f} s)", ()
        return True


class TextFormatter(logging.Formatter):
    """``<UTC time> <process> <LEVEL> <logger> [topic/partition epoch=N ...] message``."""

    def format(self, record: logging.LogRecord) -> str:
        context = []
        topic, partition = getattr(record, "topic", None), getattr(record, "partition", None)
        if topic is not None or partition is not None:
            context.append(f"{topic if topic is not None else '?'}/{partition if partition is not None else '?'}")
        epoch = getattr(record, "epoch", None)
        if epoch is not None:
            context.append(f"epoch={epoch}")
        context.extend(f"{name}={getattr(record, name)}" for name in _TEXT_CONTEXT if hasattr(record, name))
        line = (f"{_utc_timestamp(record.created)} {getattr(record, 'process_name', '-')} {record.levelname} "
                f"{record.name} {'[' + ' '.join(context) + '] ' if context else ''}{record.getMessage()}")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; context fields become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "process": getattr(record, "process_name", None),
        }
        for name in CONTEXT_FIELDS:
            if hasattr(record, name):
                out[name] = getattr(record, name)
        out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    return JsonFormatter() if log_format == "json" else TextFormatter()


def setup(level: str | int = "INFO", log_format: str = "text", *, process: str = "fabric",
          node_id: int | None = None, stream: IO[str] | None = None) -> logging.Handler:
    """Send every logger's records to one stderr handler in the chosen format. Replaces
    handlers a previous ``setup`` or ``basicConfig`` installed, so calling it twice (a CLI
    that starts a node in-process) leaves one handler, not two."""
    if isinstance(level, str):
        if level.upper() not in LOG_LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        level = level.upper()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.addFilter(_ProcessFields(process, node_id))
    handler.addFilter(_KazooRepeats())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


class ContextAdapter(logging.LoggerAdapter[logging.Logger]):
    """A logger that adds fixed context fields to every record; a call's own ``extra``
    wins over the adapter's."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def context_logger(logger: logging.Logger, **context: Any) -> ContextAdapter:
    unknown = sorted(set(context) - set(CONTEXT_FIELDS))
    if unknown:
        raise ValueError(f"unknown log context {unknown}; known: {', '.join(CONTEXT_FIELDS)}")
    return ContextAdapter(logger, context)


def replica_logger(logger: logging.Logger, *, topic: str, partition: int, epoch: int) -> ContextAdapter:
    """The logger for lines about one partition replica: replication, truncation, election."""
    return context_logger(logger, topic=topic, partition=partition, epoch=epoch)


def add_arguments(parser: argparse.ArgumentParser, default_level: str = "INFO") -> None:
    """``--log-level`` and ``--log-format``, the same in every Fabric command."""
    parser.add_argument("--log-level", default=default_level, type=str.upper, choices=LOG_LEVELS,
                        help="least severe level logged")
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                        help="text for people, json for log pipelines (one object per line)")


def context_of(record: logging.LogRecord) -> Mapping[str, Any]:
    """The context fields a record carries (for tests and custom handlers)."""
    return {name: getattr(record, name) for name in CONTEXT_FIELDS if hasattr(record, name)}

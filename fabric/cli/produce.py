"""``fabric produce TOPIC``: lines from stdin or a file become messages.

Exit code 0 when every record was acknowledged, 3 when some were and some were not, 1
when none were (or the cluster could not be reached); the last line on stderr says how
many of each.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import IO, Any

from fabric import errors
from fabric.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    I32_MAX,
    CliError,
    Progress,
    bootstrap,
    int_in_range,
    key_value,
    non_negative_float,
    partition_index,
    usage_error,
    utf8_text,
    with_bootstrap,
)
from fabric.limits import BATCH_UNCOMPRESSED_BYTES_MAX, MESSAGE_BYTES_MAX_DEFAULT
from fabric.protocol import batch as batch_format
from fabric.wording import plural

BATCH_BYTES_MAX_DEFAULT = 256 * 1024  # the SDK's default, shown in --help
DELIVERY_TIMEOUT_MS_DEFAULT = 120_000
# No batch or record is larger than what a batch may hold uncompressed, whatever the topic.
batch_bytes = int_in_range(1, BATCH_UNCOMPRESSED_BYTES_MAX, "BATCH_UNCOMPRESSED_BYTES_MAX")
delivery_timeout_ms = int_in_range(1, I32_MAX, "an i32 of milliseconds")


def header(text: str) -> tuple[str, str]:
    """``--header NAME=VALUE``: valid UTF-8, a name the batch format can carry."""
    name, value = key_value(text)
    name_bytes = len(name.encode("utf-8"))
    if name_bytes > batch_format.HEADER_NAME_BYTES_MAX:  # a u16 length in the records section (PROTOCOL.md 4.2)
        raise argparse.ArgumentTypeError(f"header name of {name_bytes:,} bytes: at most "
                                         f"{batch_format.HEADER_NAME_BYTES_MAX:,}")
    return name, value


def key_separator(text: str) -> str:
    if not utf8_text(text):
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    produce = with_bootstrap(subparsers.add_parser(
        "produce", help="send lines from stdin (or --file) as messages",
        description="Send each line of stdin (or --file) as one record; the trailing newline is not part of it.",
    ))
    produce.add_argument("topic", help="topic to send to")
    produce.add_argument("--file", "-f", help="read lines from this file instead of stdin")
    produce.add_argument("--key-sep", type=key_separator, help="split each line into key and value at the first SEP (no SEP: null key)")
    produce.add_argument("--header", action="append", type=header, default=[], metavar="NAME=VALUE",
                         help="add this header to every record (repeatable)")
    produce.add_argument("--partition", type=partition_index, help="send every record to this partition "
                         "(default: by key hash; records without a key fill one partition at a time)")
    produce.add_argument("--acks", default="all", choices=("0", "1", "all"),
                         help="all: every in-sync replica has it; 1: the leader has it; 0: do not wait")
    produce.add_argument("--compression", default="lz4", choices=("lz4", "none"), help="batch compression")
    produce.add_argument("--linger-ms", type=non_negative_float, default=5, help="how long a batch waits to fill")
    produce.add_argument("--batch-bytes-max", type=batch_bytes, default=BATCH_BYTES_MAX_DEFAULT,
                         help="a batch closes at this many bytes (a larger record gets a batch of its own)")
    produce.add_argument("--record-bytes-max", type=batch_bytes, default=MESSAGE_BYTES_MAX_DEFAULT,
                         help="refuse input lines longer than this; the topic's message_bytes_max is the "
                              "cluster's limit")
    produce.add_argument("--delivery-timeout-ms", type=delivery_timeout_ms, default=DELIVERY_TIMEOUT_MS_DEFAULT,
                         help="give up on a record not acknowledged within this long")
    produce.add_argument("--progress", action="store_true", help="show progress even when stderr is not a terminal")
    produce.add_argument("--quiet", "-q", action="store_true", help="no progress line")
    produce.set_defaults(run=cmd_produce)


def _open_source(path: str | None) -> contextlib.AbstractContextManager[IO[bytes]]:
    if path is None:
        return contextlib.nullcontext(sys.stdin.buffer)
    try:
        return open(path, "rb")
    except OSError as exc:
        raise usage_error(f"argument --file: cannot open {path!r}: {exc.strerror or exc}") from None


def cmd_produce(args: argparse.Namespace) -> int:
    from sdk import Producer

    if args.linger_ms >= args.delivery_timeout_ms:
        # Every record would expire while its batch still waits to fill.
        raise usage_error(f"argument --linger-ms: {args.linger_ms:g} is not less than --delivery-timeout-ms "
                          f"({args.delivery_timeout_ms})")
    sep = args.key_sep.encode() if args.key_sep is not None else None
    headers = [(name, value.encode()) for name, value in args.header] or None
    source_cm = _open_source(args.file)  # before connecting: a bad path is a usage error
    spec = bootstrap(args)
    progress = Progress("produced", enabled=(not args.quiet and sys.stderr.isatty()) or args.progress)
    delivered = 0
    failures: list[BaseException] = []

    def on_done(_meta: Any, exc: BaseException | None) -> None:
        nonlocal delivered
        if exc is None:
            delivered += 1
        else:
            failures.append(exc)

    sent = 0
    stopped: BaseException | None = None
    request_timeout_ms = min(30_000, args.delivery_timeout_ms)
    with source_cm as source, Producer(spec, acks=args.acks, compression=args.compression,
                                       linger_ms=args.linger_ms, batch_bytes_max=args.batch_bytes_max,
                                       buffer_bytes_max=max(64 << 20, args.batch_bytes_max),
                                       delivery_timeout_ms=args.delivery_timeout_ms,
                                       request_timeout_ms=request_timeout_ms) as producer:
        # Ask for the topic before reading input: an unknown topic or partition fails now.
        partitions = producer.partitions_for(args.topic)
        if args.partition is not None and args.partition >= partitions:
            raise CliError(f"topic {args.topic!r} has no partition {args.partition} (it has {partitions})")
        limit = args.record_bytes_max
        while True:
            line = source.readline(limit + 2)  # room for the record and its "\r\n"
            if not line:
                break
            value = line[:-1] if line.endswith(b"\n") else line
            if len(value) > limit:
                stopped = CliError(f"line {sent + 1} is longer than --record-bytes-max={limit}")
                break
            key = None
            if sep is not None and sep in value:
                key, value = value.split(sep, 1)
            try:
                producer.send(args.topic, value, key=key, headers=headers, partition=args.partition, callback=on_done)
            except errors.FabricError as exc:
                stopped = exc
                break
            except (ValueError, TypeError) as exc:
                # The SDK refuses, before queueing, what it could not encode (a header the
                # checks above let through, a value it cannot carry): the input's fault.
                stopped = CliError(str(exc), EXIT_USAGE)
                break
            sent += 1
            progress.add(1)
            if failures:
                break  # the cluster refuses: stop reading, report what got through
        producer.flush()
    progress.done()
    return _report(sent, delivered, failures, stopped)


def _report(sent: int, delivered: int, failures: list[BaseException], stopped: BaseException | None) -> int:
    if not failures and stopped is None:
        return EXIT_OK
    first = failures[0] if failures else stopped
    what = first.message if isinstance(first, CliError) else str(first)
    failed = len(failures)
    summary = f"{delivered:,} of {plural(sent, 'record')} delivered, {failed:,} failed"
    if stopped is not None:
        summary += ", input not read to the end"
    if delivered == 0:
        usage = isinstance(stopped, CliError) and stopped.exit_code == EXIT_USAGE and not failures
        raise CliError(f"{what} ({summary})", EXIT_USAGE if usage else EXIT_ERROR)
    print(f"fabric: error: {what} ({summary})", file=sys.stderr)
    return EXIT_PARTIAL if delivered else EXIT_ERROR

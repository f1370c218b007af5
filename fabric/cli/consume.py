"""``fabric consume TOPIC``: records to stdout, one line each.

Line format (docs/PROTOCOL.md section 13)::

    [PARTITION:OFFSET<TAB>][TIMESTAMP<TAB>][KEY<TAB>][HEADERS<TAB>]VALUE<LF>

each optional field present only with its --print-* flag; null shows as --null-text.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fabric import errors
from fabric.cli._common import (
    CliError,
    Progress,
    bootstrap,
    partition_index,
    positive_int,
    usage_error,
    utf8_text,
    with_bootstrap,
)
from fabric.cli.group import group_id, timestamp_ms_from_iso
from fabric.protocol.tags import TagFilter

POLL_TIMEOUT_MS = 500
ORDERED_IDLE_EXIT_S = 2.0  # --ordered without --follow: stop once nothing new came for this long


def tag_filter(text: str) -> str:
    """A ``--tags`` value that parses (docs/GROUPS.md): a bad one is a usage error (exit 2),
    not a failure after connecting."""
    text = utf8_text(text)
    try:
        TagFilter(text)
    except errors.FabricError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def from_offset(text: str) -> str | int:
    """``earliest``, ``latest`` or an offset >= 0; anything else is a usage error."""
    if text in ("earliest", "latest"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not earliest, latest or an offset >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; use earliest, latest or an offset >= 0")
    return value


def from_time(text: str) -> int:
    """``--from-time``: ISO 8601, as ``fabric group reset-offsets --datetime`` takes it, in ms
    since the epoch; anything else is a usage error."""
    try:
        return timestamp_ms_from_iso(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; give a date and time such as 2026-11-29T10:00:00Z "
                                          "(UTC when no zone is given)") from None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    consume = with_bootstrap(subparsers.add_parser(
        "consume", help="print messages to stdout",
        description="Print records, one line each: [PARTITION:OFFSET\\t][TIMESTAMP\\t][KEY\\t][HEADERS\\t]VALUE. "
                    "Without --follow, stop at the end offsets seen at the start.",
    ))
    consume.add_argument("topic", help="topic to read")
    consume.add_argument("--partition", type=partition_index, help="read only this partition (default: all)")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-offset", type=from_offset, default="earliest",
                       help="earliest, latest or an offset N (past a partition's end: an error)")
    start.add_argument("--from-time", type=from_time, metavar="ISO8601",
                       help="start each partition at its first record with a timestamp at or after this time, "
                            "e.g. 2026-11-29T10:00:00Z (UTC when no zone is given); a partition with none "
                            "starts at its end")
    consume.add_argument("--follow", action="store_true", help="keep waiting for new messages")
    consume.add_argument("--max-messages", type=positive_int, help="stop after this many")
    consume.add_argument("--print-offset", action="store_true", help="start each line with PARTITION:OFFSET")
    consume.add_argument("--print-timestamp", action="store_true", help="print the timestamp (ms since the epoch)")
    consume.add_argument("--print-key", action="store_true", help="print the key")
    consume.add_argument("--print-headers", action="store_true", help="print headers as name=value,name=value")
    consume.add_argument("--null-text", type=utf8_text, default="(null)", help="what a null key, value or header value prints as")
    consume.add_argument("--progress", action="store_true", help="a progress line on stderr")
    consume.add_argument("--group", type=group_id,
                         help="join this consumer group: share partitions, resume at committed offsets")
    consume.add_argument("--tags", type=tag_filter, help='only records whose tags match, e.g. "paid || refunded" (docs/GROUPS.md)')
    consume.add_argument("--ordered", action="store_true",
                         help="a strict-order topic in its one total order (every partition, by global ID); "
                              "without --follow, stop once nothing new came for 2 s")
    consume.add_argument("--print-global-id", action="store_true",
                         help="start each line with the record's global ID (strict-order topics; else the --null-text)")
    consume.set_defaults(run=cmd_consume)


def format_record(record: Any, args: argparse.Namespace) -> bytes:
    """One output line. Pure, so the format is tested without a cluster."""
    null = args.null_text.encode()
    parts: list[bytes] = []
    if getattr(args, "print_global_id", False):
        parts.append(null if record.global_id < 0 else b"%d" % record.global_id)
    if args.print_offset:
        parts.append(b"%d:%d" % (record.partition, record.offset))
    if args.print_timestamp:
        parts.append(b"%d" % record.timestamp)
    if args.print_key:
        parts.append(null if record.key is None else record.key)
    if args.print_headers:
        parts.append(b",".join(name.encode() + b"=" + (null if value is None else value)
                               for name, value in record.headers))
    parts.append(null if record.value is None else record.value)
    return b"\t".join(parts) + b"\n"


def cmd_consume(args: argparse.Namespace) -> int:
    from sdk import Consumer, TopicPartition

    if args.from_time is not None and (args.ordered or args.group is not None):
        # A group starts where it committed, an ordered reader at an end of the one order:
        # neither has a per-partition time to start at (`fabric group reset-offsets --to
        # datetime` moves a group's committed offsets to a time).
        flag = "--ordered" if args.ordered else "--group"
        raise usage_error(f"--from-time does not go with {flag}"
                          + (" (to start a group at a time: `fabric group reset-offsets GROUP --topic T "
                             "--to datetime --datetime ...` while it is inactive)" if flag == "--group" else ""))
    if args.ordered:  # first: it refuses --group
        return _consume_ordered(args)
    if args.group is not None:  # never truthiness: --group '' must not mean "no group" (group_id refuses it)
        from fabric.cli.group import consume_in_group

        return consume_in_group(args)
    out = sys.stdout.buffer
    progress = Progress("consumed", enabled=args.progress)
    with Consumer(bootstrap(args), tag_filter=args.tags) as consumer:
        if args.partition is None:
            tps = consumer.subscribe_all_partitions(args.topic)
        else:
            tps = [TopicPartition(args.topic, args.partition)]
            consumer.assign(tps)
        if args.from_time is not None:
            _seek_to_time(consumer, tps, args.from_time)
        elif args.from_offset == "earliest":
            consumer.seek_to_beginning()
        elif args.from_offset == "latest":
            consumer.seek_to_end()
        else:
            _seek_checked(consumer, tps, args.from_offset)
        ends = None if args.follow else consumer.end_offsets(tps)
        remaining = args.max_messages
        while True:
            if ends is not None and all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            records = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
            for r in records:
                if ends is not None and r.offset >= ends[TopicPartition(r.topic, r.partition)]:
                    continue
                out.write(format_record(r, args))
                progress.add(1)
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        out.flush()
                        return 0
            out.flush()
    progress.done()
    return 0


def _seek_checked(consumer: Any, tps: list[Any], offset: int) -> None:
    """Seek every partition to ``offset``, refusing one outside a partition's log rather
    than letting the consumer's reset policy silently replay from the start."""
    starts = consumer.beginning_offsets(tps)
    ends = consumer.end_offsets(tps)
    outside = [f"{tp} holds offsets {starts[tp]} to {ends[tp]}" for tp in tps
               if not starts[tp] <= offset <= ends[tp]]
    if outside:
        raise CliError(
            f"--from-offset {offset} is outside the log: {'; '.join(outside)} "
            "(an offset equal to the end waits for new records; `--from-offset latest` does that for every partition)"
        )
    for tp in tps:
        consumer.seek(tp, offset)


def _seek_to_time(consumer: Any, tps: list[Any], timestamp_ms: int) -> None:
    """Seek each partition to its first record with a timestamp at or after
    ``timestamp_ms``; one with none (offsets_for_times gives -1) to its end, so that only
    what comes next is read there, as ``fabric group reset-offsets --to datetime`` does."""
    found = consumer.offsets_for_times({tp: timestamp_ms for tp in tps})
    at_end = [tp for tp in tps if found[tp] < 0]
    for tp in tps:
        if found[tp] >= 0:
            consumer.seek(tp, found[tp])
    if at_end:
        consumer.seek_to_end(*at_end)


def _consume_ordered(args: argparse.Namespace) -> int:
    """``fabric consume T --ordered``: an OrderedConsumer (docs/DESIGN.md, strict order).
    Its records become final as every partition's watermark passes them (ticks move it), so
    without --follow it stops once nothing new came for ORDERED_IDLE_EXIT_S, as ``--group``
    does, rather than at end offsets."""
    import time

    from sdk import OrderedConsumer

    refused = [flag for flag, given in (("--group", args.group is not None), ("--partition", args.partition is not None),
                                        ("--tags", args.tags is not None)) if given]
    if refused:
        raise usage_error(f"--ordered reads every partition itself, in one order: it takes no {', '.join(refused)}")
    if args.from_offset not in ("earliest", "latest"):
        raise usage_error("with --ordered, --from-offset is earliest (the whole order) or latest (what comes next)")
    out = sys.stdout.buffer
    progress = Progress("consumed", enabled=args.progress)
    remaining = args.max_messages
    with OrderedConsumer(bootstrap(args), args.topic, from_beginning=args.from_offset == "earliest") as reader:
        last_data = time.monotonic()
        while args.follow or time.monotonic() - last_data <= ORDERED_IDLE_EXIT_S:
            records = reader.poll(timeout_ms=POLL_TIMEOUT_MS, max_records=remaining or 10_000)
            for r in records:
                out.write(format_record(r, args))
            out.flush()
            if records:
                last_data = time.monotonic()
                progress.add(len(records))
                if remaining is not None:
                    remaining -= len(records)
                    if remaining <= 0:
                        return 0
    progress.done()
    return 0

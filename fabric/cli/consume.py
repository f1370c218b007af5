"""``fabric consume TOPIC``: records to stdout."""

from __future__ import annotations

import argparse
import sys

from fabric.cli._common import Progress, bootstrap, with_bootstrap


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    consume = with_bootstrap(subparsers.add_parser("consume", help="print messages to stdout"))
    consume.add_argument("topic")
    consume.add_argument("--partition", type=int)
    consume.add_argument("--from-offset", default="earliest", help="earliest, latest or an offset")
    consume.add_argument("--follow", action="store_true", help="keep waiting for new messages")
    consume.add_argument("--max-messages", type=int)
    consume.add_argument("--print-offset", action="store_true")
    consume.add_argument("--print-key", action="store_true")
    consume.add_argument("--progress", action="store_true")
    consume.set_defaults(run=cmd_consume)


def cmd_consume(args: argparse.Namespace) -> int:
    from sdk import Consumer, TopicPartition

    out = sys.stdout.buffer
    progress = Progress("consumed", enabled=args.progress)
    with Consumer(bootstrap(args)) as consumer:
        if args.partition is None:
            tps = consumer.subscribe_all_partitions(args.topic)
        else:
            tps = [TopicPartition(args.topic, args.partition)]
            consumer.assign(tps)
        if args.from_offset == "earliest":
            consumer.seek_to_beginning()
        elif args.from_offset == "latest":
            consumer.seek_to_end()
        else:
            for tp in tps:
                consumer.seek(tp, int(args.from_offset))
        ends = None if args.follow else consumer.end_offsets(tps)
        remaining = args.max_messages
        while True:
            records = consumer.poll(timeout_ms=500)
            for r in records:
                if ends is not None and r.offset >= ends[TopicPartition(r.topic, r.partition)]:
                    continue
                if args.print_offset:
                    out.write(f"{r.partition}:{r.offset}\t".encode())
                if args.print_key:
                    out.write((r.key or b"") + b"\t")
                out.write((r.value or b"") + b"\n")
                progress.add(1)
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        out.flush()
                        return 0
            out.flush()
            if ends is not None and all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
    progress.done()
    return 0

"""``fabric produce TOPIC``: lines from stdin or a file become messages."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from fabric.cli._common import Progress, bootstrap, with_bootstrap


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    produce = with_bootstrap(subparsers.add_parser("produce", help="send lines from stdin (or --file) as messages"))
    produce.add_argument("topic")
    produce.add_argument("--file", "-f")
    produce.add_argument("--key-sep", help="split each line into key and value at the first SEP")
    produce.add_argument("--partition", type=int)
    produce.add_argument("--acks", default="all", choices=("0", "1", "all"))
    produce.add_argument("--compression", default="lz4", choices=("lz4", "none"))
    produce.add_argument("--linger-ms", type=float, default=5)
    produce.add_argument("--progress", action="store_true", help="show progress even when stderr is not a terminal")
    produce.add_argument("--quiet", "-q", action="store_true")
    produce.set_defaults(run=cmd_produce)


def cmd_produce(args: argparse.Namespace) -> int:
    from sdk import Producer

    progress = Progress("produced", enabled=(not args.quiet and sys.stderr.isatty()) or args.progress)
    failures: list[BaseException] = []
    sep = args.key_sep.encode() if args.key_sep else None

    def on_done(_meta: Any, exc: BaseException | None) -> None:
        if exc is not None:
            failures.append(exc)

    source_cm = open(args.file, "rb") if args.file else contextlib.nullcontext(sys.stdin.buffer)  # noqa: SIM115
    with source_cm as source, Producer(bootstrap(args), acks=args.acks, compression=args.compression,
                                       linger_ms=args.linger_ms) as producer:
        for line in source:
            value = line.rstrip(b"\n")
            key = None
            if sep is not None and sep in value:
                key, value = value.split(sep, 1)
            producer.send(args.topic, value, key=key, partition=args.partition, callback=on_done)
            progress.add(1)
            if failures:
                break
        producer.flush()
    progress.done()
    if failures:
        print(f"error: {failures[0]}", file=sys.stderr)
        return 1
    return 0

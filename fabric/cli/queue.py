"""``fabric queue create|delete|delete-group|describe|list|purge|redrive|send|receive`` (docs/QUEUES.md)."""

from __future__ import annotations

import argparse
import sys

from fabric.cli._common import (
    bootstrap,
    group_name,
    int_in_range,
    non_negative_int,
    partition_count,
    positive_int,
    replication_factor,
    usage_error,
    utf8_text,
    with_bootstrap,
)
from fabric.protocol import queues as qp
from fabric.wording import plural


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    queue = subparsers.add_parser("queue", help="work queues: create, describe, redrive, send, receive")
    queue.set_defaults(run=cmd_queue)
    qsub = queue.add_subparsers(dest="queue_command", required=True)
    create = with_bootstrap(qsub.add_parser("create", help="create a queue (a topic kept until consumed)"))
    create.add_argument("name", help="1 to 200 characters of [A-Za-z0-9._-]")
    create.add_argument("--partitions", "-p", type=partition_count, default=1, help="number of partitions")
    create.add_argument("--replication-factor", "-r", type=replication_factor, default=3,
                        help="copies of each partition")
    create.add_argument("--visibility-timeout-ms", type=positive_int, default=qp.VISIBILITY_TIMEOUT_MS_DEFAULT,
                        help=f"how long a received message stays leased (default 30 s, at most "
                             f"{qp.VISIBILITY_TIMEOUT_MS_MAX} ms = 12 h)")
    create.add_argument("--max-deliveries", type=positive_int, default=qp.MAX_DELIVERIES_DEFAULT,
                        help="deliveries before a message is dead-lettered (default 5)")
    create.add_argument("--dead-letter", metavar="QUEUE", help="dead-letter queue (created if missing)")
    create.add_argument("--message-ttl-ms", type=non_negative_int, default=0, help="queue-wide TTL (0: none)")
    create.add_argument("--max-messages", type=non_negative_int, default=0,
                        help="refuse sends (QUEUE_FULL, retriable) past this many waiting messages (0: no limit)")
    create.add_argument("--max-bytes", type=non_negative_int, default=0, help="the same in value bytes (0: no limit)")
    create.add_argument("--max-message-bytes", type=int_in_range(1024, 64 * 1024 * 1024, "message_bytes_max"),
                        default=qp.QUEUE_MESSAGE_BYTES_DEFAULT,
                        help="largest batch a producer may send, header and keys included (the topic's message_bytes_max; "
                             "default 1 MiB: one value of up to 1,048,490 bytes)")
    create.add_argument("--dedup-window-ms", type=positive_int, default=qp.DEDUP_WINDOW_MS_DEFAULT,
                        help="a repeated dedup id within this window is dropped (default 5 min)")
    create.add_argument("--group-retention-ms",
                        type=int_in_range(qp.QUEUE_GROUP_RETENTION_MS_MIN, qp.QUEUE_GROUP_RETENTION_MS_MAX,
                                          "queue_group_retention_ms"),
                        default=qp.QUEUE_GROUP_RETENTION_MS_DEFAULT,
                        help="a group idle this long (no receive, ack or lease) is deleted (default 7 days)")
    delete = with_bootstrap(qsub.add_parser("delete", help="delete a queue and its messages"))
    delete.add_argument("name")
    delete_group = with_bootstrap(qsub.add_parser(
        "delete-group", help="delete a queue's group (refused while it holds leases)"))
    delete_group.add_argument("name", help="the queue (or any topic read in queue mode)")
    delete_group.add_argument("group", help="the group to delete")
    with_bootstrap(qsub.add_parser("list", help="list queues"))
    purge = with_bootstrap(qsub.add_parser(
        "purge", help="settle every message sent so far (every group, or --group), as SQS PurgeQueue"))
    purge.add_argument("name", help="the queue (or any topic read in queue mode)")
    purge.add_argument("--group", type=group_name, default=None, help="purge for this group only (default: every group, and "
                                                     "groups that start later)")
    describe = with_bootstrap(qsub.add_parser("describe", help="settings and counts per partition"))
    describe.add_argument("name", help="a queue, or any topic read in queue mode")
    describe.add_argument("--group", "-g", default=qp.DEFAULT_GROUP, help="consumer group (default: default)")
    redrive = with_bootstrap(qsub.add_parser("redrive", help="move dead letters back to their queue"))
    redrive.add_argument("name", help="the queue to move them back to")
    redrive.add_argument("--from", dest="source", help="dead-letter queue (default: the queue's)")
    redrive.add_argument("--max-messages", type=non_negative_int, default=0, help="at most this many (0: all)")
    send = with_bootstrap(qsub.add_parser("send", help="send lines of stdin (or --message) to a queue"))
    send.add_argument("name")
    send.add_argument("--message", "-m", action="append", help="a message (repeatable; default: stdin lines)")
    # Every bound of a queue send is a constant of fabric/protocol/queues.py: checked here,
    # a usage error (exit 2) like --priority's, not a refusal after connecting (exit 1).
    send.add_argument("--delay-ms", type=int_in_range(0, qp.SEND_DELAY_MS_MAX, "DELAY_MS_MAX, 7 days"), default=0,
                      help="not delivered before this long (at most 7 days)")
    send.add_argument("--priority", type=int, choices=range(qp.PRIORITY_MIN, qp.PRIORITY_MAX + 1), metavar="0..9",
                      help=f"higher is handed out first (default {qp.PRIORITY_DEFAULT} when not given)")
    send.add_argument("--ttl-ms", type=non_negative_int, default=0, help="dropped if not delivered within this long")
    send.add_argument("--dedup-id", type=dedup_id, default="",
                      help=f"a repeat of this id within the dedup window is dropped (at most "
                           f"{qp.DEDUP_ID_BYTES_MAX} bytes of UTF-8)")
    receive = with_bootstrap(qsub.add_parser("receive", help="receive, print and acknowledge messages"))
    receive.add_argument("name")
    receive.add_argument("--group", "-g", default=qp.DEFAULT_GROUP, help="consumer group")
    receive.add_argument("--max-messages", "-n", type=positive_int, default=10, help="stop after this many")
    receive.add_argument("--wait-ms", type=non_negative_int, default=5_000, help="long-poll this long (max 20 s)")
    receive.add_argument("--no-ack", action="store_true", help="leave them leased (they come back after the timeout)")


def dedup_id(text: str) -> str:
    """A ``--dedup-id``: at most DEDUP_ID_BYTES_MAX bytes of UTF-8, as the SDK and the node take it."""
    size = len(utf8_text(text).encode())
    if size > qp.DEDUP_ID_BYTES_MAX:
        raise argparse.ArgumentTypeError(f"{size} bytes of UTF-8, more than DEDUP_ID_BYTES_MAX ({qp.DEDUP_ID_BYTES_MAX})")
    return text


def cmd_queue(args: argparse.Namespace) -> int:
    from sdk import Admin

    command = args.queue_command
    if command == "send":
        return _send(args)
    if command == "receive":
        return _receive(args)
    with Admin(bootstrap(args)) as admin:
        if command == "create":
            admin.create_queue(
                args.name, args.partitions, args.replication_factor, visibility_timeout_ms=args.visibility_timeout_ms,
                max_deliveries=args.max_deliveries, dead_letter=args.dead_letter, message_ttl_ms=args.message_ttl_ms,
                max_messages=args.max_messages, max_bytes=args.max_bytes, max_message_bytes=args.max_message_bytes,
                dedup_window_ms=args.dedup_window_ms, group_retention_ms=args.group_retention_ms)
            dlq = f", dead letters to {args.dead_letter}" if args.dead_letter else ""
            print(f"created queue {args.name} with {plural(args.partitions, 'partition')}{dlq}")
        elif command == "delete":
            admin.delete_queue(args.name)
            print(f"deleted queue {args.name}")
        elif command == "delete-group":
            partitions = admin.delete_queue_group(args.name, args.group)
            print(f"deleted group {args.group} of queue {args.name} ({plural(len(partitions), 'partition')})")
        elif command == "purge":
            purged = admin.purge_queue(args.name, args.group)
            by_group = ", ".join(f"group {g or '(no consumer yet)'}: {n:,}" for g, n in purged.items())
            whom = f"group {args.group}" if args.group else "every group"
            print(f"purged queue {args.name} for {whom}: {plural(sum(purged.values()), 'message')} ({by_group})")
        elif command == "list":
            for name in admin.list_queues():
                print(name)
        elif command == "describe":
            desc = admin.describe_queue(args.name, args.group)
            print(f"queue {desc.name} (group {desc.group})")
            for key, value in sorted(desc.settings.items()):
                print(f"  {key} = {value}")
            print(f"  {'partition':>9} {'visible':>9} {'in flight':>9} {'delayed':>9} {'dead':>9} {'dropped':>9} "
                  f"{'dedup':>9} {'oldest':>9}")
            for p in desc.partitions:
                age = f"{p.oldest_age_ms / 1000:.1f}s" if p.oldest_age_ms >= 0 else "-"
                print(f"  {p.partition:>9} {p.visible:>9} {p.in_flight:>9} {p.delayed:>9} {p.dead_lettered:>9} "
                      f"{p.dropped:>9} {p.deduplicated:>9} {age:>9}")
        elif command == "redrive":
            moved = admin.redrive(args.name, dead_letter=args.source, max_messages=args.max_messages)
            print(f"moved {plural(moved, 'dead letter')} back to {args.name}")
    return 0


def _send(args: argparse.Namespace) -> int:
    from sdk import Producer

    lines = args.message if args.message else [line.rstrip("\n") for line in sys.stdin]
    if args.dedup_id and len(lines) > 1:
        raise usage_error("--dedup-id names one message; send one at a time")
    with Producer(bootstrap(args)) as producer:
        futures = [producer.send(args.name, line.encode(), delay_ms=args.delay_ms, priority=args.priority,
                                 ttl_ms=args.ttl_ms, dedup_id=args.dedup_id) for line in lines]
        for future in futures:
            future.result(timeout=60)
    print(f"sent {plural(len(lines), 'message')} to {args.name}", file=sys.stderr)
    return 0


def _receive(args: argparse.Namespace) -> int:
    from sdk import QueueConsumer

    if args.wait_ms > qp.RECEIVE_WAIT_MS_MAX:
        raise usage_error(f"--wait-ms is at most {qp.RECEIVE_WAIT_MS_MAX} (RECEIVE_WAIT_MS_MAX)")
    got = 0
    with QueueConsumer(bootstrap(args), args.name, args.group) as worker:
        while got < args.max_messages:
            batch = worker.receive(min(args.max_messages - got, qp.RECEIVE_MESSAGES_MAX), args.wait_ms)
            if not batch:
                break
            for m in batch:
                value = (m.value or b"").decode("utf-8", "replace")
                print(f"{m.partition}/{m.offset} delivery {m.delivery_count} priority {m.priority}: {value}")
            if not args.no_ack:
                worker.ack(batch)
            got += len(batch)
    print(f"received {plural(got, 'message')}" + (" (left leased)" if args.no_ack else " (acknowledged)"),
          file=sys.stderr)
    return 0

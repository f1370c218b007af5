"""``fabric group list|describe|reset-offsets|delete``: consumer-group administration."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from fabric.cli._common import (
    CliError,
    bootstrap,
    non_negative_int,
    partition_index,
    usage_error,
    with_bootstrap,
)
from fabric.wording import plural


def group_id(text: str) -> str:
    """A consumer group id as the nodes accept it: 1 to 200 characters of [A-Za-z0-9._-].
    Checked here so an empty one is refused, not read as "no group"."""
    from fabric import errors
    from fabric.protocol.groups import check_group_id

    try:
        check_group_id(text)
    except errors.FabricError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def timestamp_ms_from_iso(text: str) -> int:
    """An ISO 8601 date and time (``2026-11-22T20:00:00Z``; one without a zone is UTC) as
    milliseconds since the Unix epoch, for ``reset-offsets --datetime`` and ``fabric consume
    --from-time``. ValueError saying why (its message is ``TEXT is ...``) when it is not ISO
    8601 or is before 1970: LIST_OFFSETS reads a negative timestamp as earliest/latest."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not ISO 8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    timestamp_ms = int(moment.timestamp() * 1000)
    if timestamp_ms < 0:
        raise ValueError(f"{text!r} is before 1970")
    return timestamp_ms


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser("group", help="consumer groups: list, describe (lag), reset offsets, delete")
    actions = group.add_subparsers(dest="group_command", required=True)
    with_bootstrap(actions.add_parser("list", help="every group and its state")).set_defaults(run=cmd_list)
    describe = with_bootstrap(actions.add_parser("describe", help="members, assignment, committed offsets and lag"))
    describe.add_argument("group_id", type=group_id)
    describe.set_defaults(run=cmd_describe)
    reset = with_bootstrap(actions.add_parser("reset-offsets", help="move committed offsets (group must be inactive)"))
    reset.add_argument("group_id", type=group_id)
    reset.add_argument("--topic", required=True)
    reset.add_argument("--to", required=True, choices=("earliest", "latest", "datetime", "offset"))
    reset.add_argument("--offset", type=non_negative_int, help="with --to offset")
    reset.add_argument("--datetime", help="with --to datetime: ISO 8601, e.g. 2026-11-22T20:00:00Z")
    reset.add_argument("--partition", type=partition_index, action="append",
                       help="only these partitions (repeatable)")
    reset.add_argument("--dry-run", action="store_true", help="print the offsets it would commit; commit nothing")
    reset.set_defaults(run=cmd_reset)
    delete = with_bootstrap(actions.add_parser("delete", help="delete a group and its offsets (must be inactive)"))
    delete.add_argument("group_id", type=group_id)
    delete.set_defaults(run=cmd_delete)


def cmd_list(args: argparse.Namespace) -> int:
    from sdk import Admin

    with Admin(bootstrap(args)) as admin:
        groups = admin.list_groups()
    print(f"{'GROUP':<40} {'STATE':<12} MEMBERS")
    for g in groups:
        print(f"{g.group_id:<40} {g.state:<12} {g.members}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from sdk import Admin

    with Admin(bootstrap(args)) as admin:
        desc = admin.describe_group(args.group_id)
    print(f"group {desc.group_id}: {desc.state}, epoch {desc.group_epoch}, {plural(len(desc.members), 'member')}")
    for m in desc.members:
        subscription = ",".join(m.subscribed_topics) or ""
        if m.subscribed_pattern:
            subscription += f" /{m.subscribed_pattern}/"
        static = f" instance={m.instance_id}" if m.instance_id else ""
        parts = " ".join(str(tp) for tp in m.assignment) or "-"
        revoking = f" revoking: {' '.join(str(tp) for tp in m.revoking)}" if m.revoking else ""
        print(f"  member {m.member_id} epoch={m.member_epoch}{static} subscribed={subscription}: {parts}{revoking}")
    print(f"{'TOPIC':<30} {'PART':>4} {'COMMITTED':>12} {'LOG-END':>12} {'LAG':>10}  MEMBER")
    for p in desc.offsets:
        # "-" where a value is unknown: no commit yet (then no lag either, as in Kafka's
        # kafka-consumer-groups), or no leader to give the log end.
        committed = "-" if p.committed is None else str(p.committed)
        log_end = "-" if p.log_end < 0 else str(p.log_end)
        lag = "-" if p.lag is None else str(p.lag)
        print(f"{p.topic:<30} {p.partition:>4} {committed:>12} {log_end:>12} {lag:>10}  {p.member_id or '-'}")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    from sdk import Admin

    timestamp_ms = None
    if args.to == "datetime":
        if not args.datetime:
            raise usage_error("--to datetime needs --datetime (ISO 8601)")
        try:
            timestamp_ms = timestamp_ms_from_iso(args.datetime)
        except ValueError as exc:
            raise usage_error(f"--datetime {exc}") from None
    if args.to == "offset" and args.offset is None:
        raise usage_error("--to offset needs --offset N (N >= 0)")
    if args.offset is not None and args.to != "offset":  # it was dropped without a word
        raise usage_error(f"--offset goes with --to offset, not --to {args.to}")
    if args.datetime is not None and args.to != "datetime":
        raise usage_error(f"--datetime goes with --to datetime, not --to {args.to}")
    with Admin(bootstrap(args)) as admin:
        done = admin.reset_offsets(args.group_id, args.topic, to=args.to, offset=args.offset,
                                   timestamp_ms=timestamp_ms, partitions=args.partition, dry_run=args.dry_run)
    for tp, offset in sorted(done.items(), key=lambda kv: kv[0].partition):
        if args.offset is not None and offset != args.offset:
            print(clamp_warning(str(tp), args.offset, offset, dry_run=args.dry_run), file=sys.stderr)
        print(f"{tp}\t{offset}")
    if args.dry_run:
        print("fabric group reset-offsets: dry run, nothing committed", file=sys.stderr)
    return 0


def clamp_warning(partition: str, asked: int, committed: int, *, dry_run: bool = False) -> str:
    """The line saying that ``--to offset`` was kept inside the partition's log: as Kafka's
    kafka-consumer-groups, the reset still happens (Admin.reset_offsets clamps to the log
    start or end offset), but not silently."""
    if asked > committed:
        where = f"past the partition's end offset {committed} (the offset its next record gets)"
    else:
        where = f"before the partition's log start offset {committed} (older records are gone)"
    return (f"fabric group reset-offsets: warning: {partition}: offset {asked} is {where}; "
            f"{'would be ' if dry_run else ''}set to {committed}")


def cmd_delete(args: argparse.Namespace) -> int:
    from sdk import Admin

    with Admin(bootstrap(args)) as admin:
        admin.delete_group(args.group_id)
    print(f"deleted group {args.group_id}")
    return 0


GROUP_IDLE_EXIT_S = 2.0  # without --follow, a group consumer stops after this long with nothing new
# Without --follow, a member that has not been given a partition this long after it joined
# says so and stops (the group's other members hold them all, or no node answers): it waited
# silently for ever.
GROUP_ASSIGN_WAIT_S = 15.0


def consume_in_group(args: argparse.Namespace) -> int:
    """``fabric consume T --group G``: a member of G; commits exactly what it printed."""
    import time

    from fabric.cli.consume import format_record  # here: fabric.cli.consume imports this module
    from sdk import Admin, Consumer, TopicPartition

    if args.partition is not None:
        raise usage_error("--group and --partition exclude each other: the group assigns partitions")
    reset = args.from_offset if args.from_offset in ("earliest", "latest") else None
    if reset is None:
        raise usage_error("with --group, --from-offset is where a partition without a committed offset starts: "
                          "earliest or latest")
    out = sys.stdout.buffer
    remaining = args.max_messages
    spec = bootstrap(args)  # once: it also checks that the cluster is reachable
    with Admin(spec) as admin:
        admin.describe_topic(args.topic)  # an unknown topic is one line and exit 1, as without --group
    with Consumer(spec, group_id=args.group, auto_offset_reset=reset, enable_auto_commit=False,
                  tag_filter=args.tags) as consumer:
        consumer.subscribe([args.topic])
        joined = last_data = time.monotonic()
        while True:
            records = consumer.poll(timeout_ms=500)
            if remaining is not None:
                records = records[:remaining]
            printed: dict[TopicPartition, int] = {}
            for r in records:
                out.write(format_record(r, args))  # the same line as without --group, every --print-* flag
                printed[TopicPartition(r.topic, r.partition)] = r.offset + 1
            out.flush()
            if printed:
                consumer.commit_async(printed)
                last_data = time.monotonic()
                if remaining is not None:
                    remaining -= len(records)
                    if remaining <= 0:
                        return 0
            elif not args.follow and consumer.assignment() and time.monotonic() - last_data > GROUP_IDLE_EXIT_S:
                return 0
            elif not args.follow and not consumer.assignment() and time.monotonic() - joined > GROUP_ASSIGN_WAIT_S:
                raise CliError(f"group {args.group!r} gave this member no partition of {args.topic!r} within "
                               f"{GROUP_ASSIGN_WAIT_S:g} s (its other members may hold them all, or no node answers; "
                               "`fabric group describe` shows the group; --follow waits for one)")

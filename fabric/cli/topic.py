"""``fabric topic create|list|describe|delete|alter|add-partitions|elect-leaders|reassign``."""

from __future__ import annotations

import argparse
from typing import Any

from fabric.cli import reassign
from fabric.cli._common import (
    bootstrap,
    key_value,
    partition_count,
    replication_factor,
    utf8_text,
    with_bootstrap,
)
from fabric.wording import plural
from fabric.zk import TopicConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topic = subparsers.add_parser("topic", help="create, list, describe and delete topics")
    topic.set_defaults(run=cmd_topic)
    tsub = topic.add_subparsers(dest="topic_command", required=True)
    create = with_bootstrap(tsub.add_parser("create", help="create a topic"))
    create.add_argument("name", help="1 to 200 characters of [A-Za-z0-9._-]")
    create.add_argument("--partitions", "-p", type=partition_count, default=1, help="number of partitions")
    create.add_argument("--replication-factor", "-r", type=replication_factor, default=3,
                        help="copies of each partition (at most the number of live nodes)")
    create.add_argument("--config", "-c", action="append", type=key_value, metavar="KEY=VALUE",
                        help=f"topic config, repeatable: {', '.join(TopicConfig.SETTABLE)} "
                             "(docs/PROTOCOL.md 5.5; the queue settings: docs/QUEUES.md)")
    create.add_argument("--strict-order", action="store_true",
                        help="one total order across partitions: records get global IDs from the sequencer")
    with_bootstrap(tsub.add_parser("list", help="list topic names"))
    describe = with_bootstrap(tsub.add_parser("describe", help="configs and partitions of a topic (default: all)"))
    describe.add_argument("name", nargs="?", help="topic (default: every topic)")
    delete = with_bootstrap(tsub.add_parser("delete", help="delete a topic and its data"))
    delete.add_argument("name", help="topic")
    alter = with_bootstrap(tsub.add_parser("alter", help="change some of a topic's configs (the others stay)"))
    alter.add_argument("name", help="topic")
    alter.add_argument("--config", "-c", action="append", type=key_value, required=True, metavar="KEY=VALUE",
                       help="repeatable: retention_ms, retention_bytes, message_bytes_max, min_insync, "
                            "unclean_leader_election, strict_order_tick_ms, or a queue's visibility_timeout_ms, "
                            "max_deliveries, message_ttl_ms, max_messages, max_bytes, queue_group_retention_ms")
    grow = with_bootstrap(tsub.add_parser("add-partitions", help="grow a topic to N partitions"))
    grow.add_argument("name", help="topic")
    grow.add_argument("--partitions", "-p", type=partition_count, required=True, help="the new total")
    elect = with_bootstrap(tsub.add_parser("elect-leaders", help="move leaders back to the preferred replicas"))
    elect.add_argument("names", nargs="*", type=utf8_text, help="topics (default: all)")
    reassign.add_parser(tsub, with_bootstrap)


def cmd_topic(args: argparse.Namespace) -> int:
    from sdk import Admin

    with Admin(bootstrap(args)) as admin:
        if args.topic_command == "create":
            config: dict[str, Any] = dict(args.config or [])
            admin.create_topic(args.name, args.partitions, args.replication_factor, config,
                               strict_order=args.strict_order)
            strict = args.strict_order or str(config.get("strict_order", "")).lower() in ("true", "1")  # as TopicConfig reads it
            kind = " (strict order)" if strict else ""
            print(f"created topic {args.name} with {plural(args.partitions, 'partition')}{kind}")
        elif args.topic_command == "list":
            for name in admin.list_topics():
                print(name)
        elif args.topic_command == "describe":
            descriptions = admin.describe_topics([args.name] if args.name else None)
            copies = admin.describe_replicas([args.name] if args.name else None)
            for desc in descriptions:
                print(f"topic {desc.name}")
                for key, value in sorted(desc.configs.items()):
                    print(f"  {key} = {value}")
                for p in desc.partitions:
                    print(f"  partition {p.partition}: leader {p.leader} epoch {p.leader_epoch} "
                          f"replicas {list(p.replicas)} isr {list(p.isr)} "
                          f"{reassign.log_line(copies.get((desc.name, p.partition), []))}")
        elif args.topic_command == "delete":
            admin.delete_topic(args.name)
            print(f"deleted topic {args.name}")
        elif args.topic_command == "alter":
            admin.alter_topic_config(args.name, dict(args.config))
            print(f"topic {args.name}: " + ", ".join(f"{key}={value}" for key, value in args.config))
        elif args.topic_command == "add-partitions":
            admin.create_partitions(args.name, args.partitions)
            print(f"topic {args.name} now has {plural(args.partitions, 'partition')}")
        elif args.topic_command == "reassign":
            return reassign.cmd_reassign(admin, args)
        elif args.topic_command == "elect-leaders":
            if args.names:
                # The controller skips a name it does not know ("moved 0"): a typo would pass
                # for success. Ask first, so an unknown topic fails as in `topic describe`.
                admin.describe_topics(args.names)
            moved = admin.elect_preferred_leaders(args.names or None)
            print(f"moved leadership of {plural(moved, 'partition')} back to their preferred replicas")
    return 0

"""The ``fabric`` command line.

    fabric up                      local cluster: ZooKeeper + 3 nodes, until Ctrl-C
    fabric demo                    the quickstart job: cluster, 100,000+ messages, summary
    fabric node --id N --zk ...    one storage node
    fabric topic create|list|describe|delete
    fabric produce TOPIC           lines from stdin or --file
    fabric consume TOPIC           records to stdout (--follow to keep going)
    fabric bench                   the produce/consume benchmark (python -m bench)

Commands that talk to a cluster take ``--bootstrap`` (``zk://host:port`` or node
addresses); without it they use ``$FABRIC_BOOTSTRAP`` or the cluster that ``fabric up``
recorded in ``~/.fabric/local.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fabric import errors

STATE_FILE = Path(os.environ.get("FABRIC_HOME", Path.home() / ".fabric")) / "local.json"
PROGRESS_INTERVAL_S = 1.0


def _bootstrap(args: argparse.Namespace) -> str:
    if getattr(args, "bootstrap", None):
        return str(args.bootstrap)
    env = os.environ.get("FABRIC_BOOTSTRAP")
    if env:
        return env
    try:
        return str(json.loads(STATE_FILE.read_text())["bootstrap"])
    except (OSError, ValueError, KeyError):
        raise SystemExit(
            "no cluster given: pass --bootstrap zk://HOST:PORT (or node addresses), set FABRIC_BOOTSTRAP, "
            "or start one with `fabric up`"
        ) from None


class Progress:
    """A one-line progress report on stderr, at most once a second."""

    def __init__(self, label: str, total: int | None = None, enabled: bool = True) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.count = 0
        self.started = time.monotonic()
        self._last = 0.0

    def add(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            self._print(now)

    def _print(self, now: float, end: str = "\r") -> None:
        rate = self.count / max(now - self.started, 1e-9)
        of = f"/{self.total:,}" if self.total else ""
        sys.stderr.write(f"{self.label}: {self.count:,}{of} messages, {rate:,.0f} msg/s   {end}")
        sys.stderr.flush()

    def done(self) -> float:
        elapsed = time.monotonic() - self.started
        if self.enabled:
            self._print(time.monotonic(), end="\n")
        return elapsed


# -- up ----------------------------------------------------------------------------------------
def cmd_up(args: argparse.Namespace) -> int:
    from fabric.local import LocalCluster

    base_dir = Path(args.data_dir) if args.data_dir else None
    cluster = LocalCluster(args.nodes, base_dir)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"starting ZooKeeper and {args.nodes} storage nodes ...", flush=True)
    cluster.start()
    try:
        STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps({"bootstrap": cluster.bootstrap, "zk": cluster.zk_address, "pid": os.getpid()}))
        from sdk import Admin

        with Admin(cluster.bootstrap) as admin:
            nodes = admin.nodes()
        print(f"ZooKeeper  {cluster.zk_address}")
        for node_id, address in sorted(nodes.items()):
            print(f"node {node_id}     {address}")
        print(f"bootstrap  {cluster.bootstrap}   (recorded in {STATE_FILE})")
        print(f"data       {cluster.base_dir}")
        print("Ctrl-C stops everything.", flush=True)
        while not stop.wait(1.0):
            dead = [n for n, node in cluster.nodes.items() if not node.process.running]
            if dead:
                print(f"node(s) {dead} exited; see {cluster.base_dir}/node*.log", file=sys.stderr)
                return 1
    finally:
        print("stopping ...", flush=True)
        cluster.stop()
        try:
            if json.loads(STATE_FILE.read_text()).get("pid") == os.getpid():
                STATE_FILE.unlink()
        except (OSError, ValueError):
            pass
        print("stopped.")
    return 0


# -- topics ------------------------------------------------------------------------------------
def cmd_topic(args: argparse.Namespace) -> int:
    from sdk import Admin

    with Admin(_bootstrap(args)) as admin:
        if args.topic_command == "create":
            config: dict[str, Any] = {}
            for item in args.config or []:
                key, _, value = item.partition("=")
                config[key] = value
            admin.create_topic(args.name, args.partitions, args.replication_factor, config)
            print(f"created topic {args.name} with {args.partitions} partitions")
        elif args.topic_command == "list":
            for name in admin.list_topics():
                print(name)
        elif args.topic_command == "describe":
            for desc in admin.describe_topics([args.name] if args.name else None):
                print(f"topic {desc.name}")
                for key, value in sorted(desc.configs.items()):
                    print(f"  {key} = {value}")
                for p in desc.partitions:
                    print(f"  partition {p.partition}: leader {p.leader} epoch {p.leader_epoch} "
                          f"replicas {list(p.replicas)} isr {list(p.isr)}")
        elif args.topic_command == "delete":
            admin.delete_topic(args.name)
            print(f"deleted topic {args.name}")
        elif args.topic_command == "add-partitions":
            admin.create_partitions(args.name, args.partitions)
            print(f"topic {args.name} now has {args.partitions} partitions")
        elif args.topic_command == "elect-leaders":
            moved = admin.elect_preferred_leaders(args.names or None)
            print(f"moved leadership of {moved} partitions back to their preferred replicas")
    return 0


# -- produce / consume -------------------------------------------------------------------------
def cmd_produce(args: argparse.Namespace) -> int:
    from sdk import Producer

    progress = Progress("produced", enabled=(not args.quiet and sys.stderr.isatty()) or args.progress)
    failures: list[BaseException] = []
    sep = args.key_sep.encode() if args.key_sep else None

    def on_done(_meta: Any, exc: BaseException | None) -> None:
        if exc is not None:
            failures.append(exc)

    source_cm = open(args.file, "rb") if args.file else contextlib.nullcontext(sys.stdin.buffer)  # noqa: SIM115
    with source_cm as source, Producer(_bootstrap(args), acks=args.acks, compression=args.compression,
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


def cmd_consume(args: argparse.Namespace) -> int:
    from sdk import Consumer, TopicPartition

    out = sys.stdout.buffer
    progress = Progress("consumed", enabled=args.progress)
    with Consumer(_bootstrap(args)) as consumer:
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


# -- demo: the quickstart's main job -----------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """Start a local cluster, push N keyed messages through it and read them all back."""
    from fabric.local import LocalCluster
    from sdk import Admin, Consumer, Producer, TopicPartition

    n = args.messages
    topic = "demo-events"
    print(f"== Fabric demo: ZooKeeper + {args.nodes} storage nodes, {n:,} messages of {args.size} bytes, "
          f"replication factor {min(3, args.nodes)}, acks=all, idempotent producer", flush=True)
    with LocalCluster(args.nodes) as cluster:
        print(f"cluster up: ZooKeeper {cluster.zk_address}, nodes {sorted(cluster.nodes)}", flush=True)
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(topic, partitions=args.partitions, replication_factor=min(3, args.nodes))
        filler = b"x" * max(0, args.size - 24)
        progress = Progress("produce", n)
        sent: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(args.partitions)}
        with Producer(cluster.bootstrap, acks="all", linger_ms=5) as producer:
            futures = []
            for i in range(n):
                futures.append(producer.send(topic, b"%024d" % i + filler, key=b"user-%d" % (i % 1000)))
                progress.add(1)
            producer.flush(timeout=120)
            produce_s = progress.done()
            for i, future in enumerate(futures):
                meta = future.result(0)
                sent[meta.partition].append((meta.offset, b"%024d" % i + filler))
        # The checksum covers every partition's values in offset order, so it checks
        # content, count and per-partition order at once.
        expected = hashlib.sha256()
        for p in sorted(sent):
            for _offset, value in sorted(sent[p]):
                expected.update(value)
        received: dict[int, list[bytes]] = {p: [] for p in range(args.partitions)}
        progress = Progress("consume", n)
        with Consumer(cluster.bootstrap) as consumer:
            consumer.assign([TopicPartition(topic, p) for p in range(args.partitions)])
            count = 0
            deadline = time.monotonic() + 120
            while count < n and time.monotonic() < deadline:
                for batch in consumer.poll_batches(timeout_ms=1000):
                    received[batch.partition].extend(v or b"" for v in batch.values)
                    count += len(batch)
                    progress.add(len(batch))
            consume_s = progress.done()
        got = hashlib.sha256()
        for p in sorted(received):
            for value in received[p]:
                got.update(value)
        ok = count == n and got.digest() == expected.digest()
        mb = n * args.size / 1e6
        summary = {
            "messages_produced": n,
            "messages_consumed": count,
            "checksum_match": got.digest() == expected.digest(),
            "produce_msgs_per_s": round(n / produce_s),
            "produce_mb_per_s": round(mb / produce_s, 1),
            "consume_msgs_per_s": round(count / consume_s),
            "consume_mb_per_s": round(mb / consume_s, 1),
            "partitions": args.partitions,
            "nodes": args.nodes,
        }
        print("== summary")
        print(f"  produced  {n:,} messages in {produce_s:.2f} s: {summary['produce_msgs_per_s']:,} msg/s, {summary['produce_mb_per_s']} MB/s")
        print(f"  consumed  {count:,} messages in {consume_s:.2f} s: {summary['consume_msgs_per_s']:,} msg/s, {summary['consume_mb_per_s']} MB/s")
        print(f"  verified  count {'OK' if count == n else 'MISMATCH'}, sha256 over per-partition order {'OK' if summary['checksum_match'] else 'MISMATCH'}")
        print(json.dumps(summary))
    return 0 if ok else 1


def cmd_node(argv: list[str]) -> int:
    from nodes.server import main as node_main

    return node_main(argv)


def cmd_bench(argv: list[str]) -> int:
    from bench.__main__ import main as bench_main

    return bench_main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fabric", description="Fabric messaging: local cluster, topics, produce, consume.")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run ZooKeeper and storage nodes locally until Ctrl-C")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--data-dir", help="keep data here (default: a temporary dir, removed on exit)")

    demo = sub.add_parser("demo", help="start a local cluster, produce and consume messages, print a summary")
    demo.add_argument("--messages", type=int, default=200_000)
    demo.add_argument("--size", type=int, default=100, help="message size in bytes")
    demo.add_argument("--partitions", type=int, default=6)
    demo.add_argument("--nodes", type=int, default=3)

    sub.add_parser("node", help="run one storage node (see fabric node --help)", add_help=False)
    sub.add_parser("bench", help="run the benchmark (see fabric bench --help)", add_help=False)

    def with_bootstrap(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--bootstrap", "-b", help="zk://host:port or tcp://node,tcp://node")
        return p

    topic = sub.add_parser("topic", help="create, list, describe and delete topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True)
    create = with_bootstrap(tsub.add_parser("create"))
    create.add_argument("name")
    create.add_argument("--partitions", "-p", type=int, default=1)
    create.add_argument("--replication-factor", "-r", type=int, default=3)
    create.add_argument("--config", "-c", action="append", help="key=value, e.g. retention_ms=86400000")
    with_bootstrap(tsub.add_parser("list"))
    describe = with_bootstrap(tsub.add_parser("describe"))
    describe.add_argument("name", nargs="?")
    delete = with_bootstrap(tsub.add_parser("delete"))
    delete.add_argument("name")
    grow = with_bootstrap(tsub.add_parser("add-partitions", help="grow a topic to N partitions"))
    grow.add_argument("name")
    grow.add_argument("--partitions", "-p", type=int, required=True, help="the new total")
    elect = with_bootstrap(tsub.add_parser("elect-leaders", help="move leaders back to the preferred replicas"))
    elect.add_argument("names", nargs="*", help="topics (default: all)")

    produce = with_bootstrap(sub.add_parser("produce", help="send lines from stdin (or --file) as messages"))
    produce.add_argument("topic")
    produce.add_argument("--file", "-f")
    produce.add_argument("--key-sep", help="split each line into key and value at the first SEP")
    produce.add_argument("--partition", type=int)
    produce.add_argument("--acks", default="all", choices=("0", "1", "all"))
    produce.add_argument("--compression", default="lz4", choices=("lz4", "none"))
    produce.add_argument("--linger-ms", type=float, default=5)
    produce.add_argument("--progress", action="store_true", help="show progress even when stderr is not a terminal")
    produce.add_argument("--quiet", "-q", action="store_true")

    consume = with_bootstrap(sub.add_parser("consume", help="print messages to stdout"))
    consume.add_argument("topic")
    consume.add_argument("--partition", type=int)
    consume.add_argument("--from-offset", default="earliest", help="earliest, latest or an offset")
    consume.add_argument("--follow", action="store_true", help="keep waiting for new messages")
    consume.add_argument("--max-messages", type=int)
    consume.add_argument("--print-offset", action="store_true")
    consume.add_argument("--print-key", action="store_true")
    consume.add_argument("--progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "node":
        return cmd_node(argv[1:])
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    handlers = {"up": cmd_up, "demo": cmd_demo, "topic": cmd_topic, "produce": cmd_produce, "consume": cmd_consume}
    try:
        return handlers[args.command](args)
    except errors.FabricError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

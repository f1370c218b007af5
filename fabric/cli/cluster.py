"""``fabric up``, ``fabric demo`` and ``fabric node``: running a cluster."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from fabric.cli._common import STATE_FILE, Progress


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = subparsers.add_parser("up", help="run ZooKeeper and storage nodes locally until Ctrl-C")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--data-dir", help="keep data here (default: a temporary dir, removed on exit)")
    up.add_argument("--config", metavar="NODE.toml",
                    help="node options for every node (docs/OPERATIONS.md); id, zk and data_dir are set per node")
    up.set_defaults(run=cmd_up)

    demo = subparsers.add_parser("demo", help="start a local cluster, produce and consume messages, print a summary")
    demo.add_argument("--messages", type=int, default=200_000)
    demo.add_argument("--size", type=int, default=100, help="message size in bytes")
    demo.add_argument("--partitions", type=int, default=6)
    demo.add_argument("--nodes", type=int, default=3)
    demo.set_defaults(run=cmd_demo)

    # The node parses its own arguments (it is also ``python -m nodes``): pass them through.
    node = subparsers.add_parser("node", help="run one storage node (see fabric node --help)", add_help=False)
    node.set_defaults(run_argv=cmd_node)


def cmd_up(args: argparse.Namespace) -> int:
    from fabric.local import LocalCluster

    base_dir = Path(args.data_dir) if args.data_dir else None
    node_args = ["--config", str(Path(args.config).resolve())] if args.config else []
    if node_args:
        from fabric import config

        config.load_node_settings(["--id", "1", "--zk", "-", "--data-dir", "-", *node_args])  # refuse a bad file now
    cluster = LocalCluster(args.nodes, base_dir, node_args=node_args, sequencer_count=2)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"starting ZooKeeper, {args.nodes} storage nodes and 2 sequencers ...", flush=True)
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
        print(f"sequencers {sorted(cluster.sequencers)} (active: {cluster.active_sequencer()}; strict-order topics)")
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
    from nodes.launch import main as node_main

    return node_main(argv)

"""``fabric up``, ``fabric demo`` and ``fabric node``: running a cluster."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from fabric.cli._common import (
    STATE_FILE,
    CliError,
    Parser,
    Progress,
    bootstrap,
    int_in_range,
    make_directory,
    node_id,
    partition_count,
    positive_int,
    quiet_libraries,
    with_bootstrap,
)
from fabric.cli._queue_demo import queue_demo
from fabric.cli._reassign_demo import reassign_demo
from fabric.wording import plural

if TYPE_CHECKING:
    from fabric.local import ProcessStartError  # imported where used: `fabric --help` stays fast

# Each demo message starts with its sequence number in this many digits, so a smaller
# --size was sent as this many bytes while the summary (and its MB/s) said --size.
DEMO_SEQUENCE_BYTES = 24
DEMO_MESSAGE_BYTES_MAX = 1024 * 1024  # 200,000 of them by default: far more is a typo
demo_message_bytes = int_in_range(DEMO_SEQUENCE_BYTES, DEMO_MESSAGE_BYTES_MAX,
                                  "each message carries its 24-digit sequence number; at most 1 MiB")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = subparsers.add_parser("up", help="run ZooKeeper and storage nodes locally until Ctrl-C")
    up.add_argument("--nodes", type=positive_int, default=3, help="storage nodes to start")
    up.add_argument("--data-dir", help="keep data here (default: a temporary dir, removed on exit)")
    up.add_argument("--zk-servers", type=int, default=1, choices=(1, 3, 5),
                    help="ZooKeeper servers: 1, or an ensemble of 3 or 5")
    up.add_argument("--config", metavar="NODE.toml",
                    help="node options for every node (docs/OPERATIONS.md); id, zk and data_dir are set per node")
    up.add_argument("--secure", action="store_true",
                    help="CURVE on every node socket, registered keys only, ACLs, ZooKeeper digest ACLs; "
                         "keys are made in DATA/security (docs/SECURITY.md)")
    up.set_defaults(run=cmd_up)

    demo = subparsers.add_parser("demo", help="start a local cluster, produce and consume messages, print a summary")
    demo.add_argument("--messages", type=positive_int, default=200_000, help="keyed messages to produce and consume")
    demo.add_argument("--size", type=demo_message_bytes, default=100,
                      help=f"message size in bytes, {DEMO_SEQUENCE_BYTES} to {DEMO_MESSAGE_BYTES_MAX:,}")
    demo.add_argument("--partitions", type=partition_count, default=6, help="partitions of the demo topic")
    demo.add_argument("--nodes", type=positive_int, default=3, help="storage nodes of the demo's cluster")
    demo.set_defaults(run=cmd_demo)

    # The node parses its own arguments (it is also ``python -m nodes``): pass them through.
    node = subparsers.add_parser("node", help="run one storage node (see fabric node --help)", add_help=False,
                                 keeps_unknown=True)
    node.set_defaults(run_argv=cmd_node)


def _require_zookeeper() -> None:
    """A clear one-line error, not "internal error RuntimeError", on a machine without it."""
    from fabric.local import zookeeper_available

    if not zookeeper_available():
        raise CliError("ZooKeeper is not installed: apt-get install -y zookeeper default-jre-headless "
                       "(the README's first command, scripts/install.sh, does this)")


def _start_error(exc: ProcessStartError) -> CliError:
    """A ZooKeeper server, node or sequencer that could not start (the cluster has stopped
    whatever it had started): its own one-line reason (a `host` not of this machine, a
    port in use), not its log pasted in; the log only if it outlives the start (a --data-dir)."""
    return CliError(f"{exc.summary} (log: {exc.log_path})" if exc.log_path.exists() else exc.summary)


def cmd_up(args: argparse.Namespace) -> int:
    from fabric import config
    from fabric.local import LocalCluster, ProcessStartError

    _require_zookeeper()
    node_args = ["--config", str(Path(args.config).resolve())] if args.config else []
    # Refuse a bad file (or FABRIC_NODE_* variable) now, before anything starts or is made
    # (a --data-dir was created, then the file refused). Its session_timeout_ms is the
    # cluster's: LocalCluster passes --session-timeout-ms to every node and sequencer, and a
    # flag wins over the file, so it used to be ignored silently.
    settings = config.load_node_settings(["--id", "1", "--zk", "-", "--data-dir", "-", *node_args])
    base_dir = make_directory(args.data_dir, "--data-dir") if args.data_dir else None
    sequencers = 2
    cluster = LocalCluster(args.nodes, base_dir, node_args=node_args, sequencer_count=sequencers,
                           zk_servers=args.zk_servers, secure=args.secure, stable_ports=True,
                           session_timeout_ms=settings["session_timeout_ms"])
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # SIGUSR1 starts the nodes left down (a full disk, too many crashes) again, once the
    # user has fixed why: what `systemctl start` is to a unit stopped by RestartPreventExitStatus.
    start_again = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: start_again.set())
    cluster.supervisor.start_again_how = f"kill -USR1 {os.getpid()} to have fabric up start it again"
    zookeeper = "ZooKeeper" if args.zk_servers == 1 else f"a {args.zk_servers}-server ZooKeeper ensemble"
    mode = "secure (CURVE, ACLs)" if args.secure else "plaintext"
    print(f"starting {zookeeper}, {plural(args.nodes, f'{mode} storage node')} and {plural(sequencers, 'sequencer')} ...",
          flush=True)
    try:
        cluster.start()
    except ProcessStartError as exc:
        raise _start_error(exc) from None
    try:
        STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
        state = {"bootstrap": cluster.bootstrap, "zk": cluster.zk_address, "pid": os.getpid()}
        if cluster.security is not None:
            state["zk_digest_file"] = str(cluster.security.digest_file)
        STATE_FILE.write_text(json.dumps(state))
        from sdk import Admin

        with Admin(cluster.bootstrap, security=cluster.security.client() if cluster.security else None) as admin:
            nodes = admin.nodes()
        print(f"ZooKeeper  {cluster.zk_address}")
        for node_id, address in sorted(nodes.items()):
            print(f"node {node_id}     {address}")
        if cluster.sequencers:
            print(f"sequencers {sorted(cluster.sequencers)} (active: {cluster.active_sequencer()}; strict-order topics)")
        print(f"bootstrap  {cluster.bootstrap}   (recorded in {STATE_FILE})")
        print(f"data       {cluster.base_dir}")
        if cluster.security is not None:
            print(f"keys       {cluster.security.directory} (operator key admin: role super)")
            print("To use the cluster as the operator (SDK, CLI, C client), export:")
            for name, value in cluster.security.environment().items():
                print(f"  export {name}={value}")
            print("Add users with: fabric keys generate alice; fabric principal add alice --key alice.key; "
                  "fabric acl add -p alice -o produce --topic events")
            print(f"Direct-plane services and callers get their own key and FABRIC_ZK_DIGEST_FILE="
                  f"{cluster.security.direct_digest_file} (the registry only; docs/SECURITY.md)")
        print("A process that dies is restarted with backoff (see docs/OPERATIONS.md); one whose disk is full is "
              f"left down until kill -USR1 {os.getpid()}. Ctrl-C stops everything.", flush=True)
        while not stop.wait(1.0):
            # Keep the cluster running: a node killed (kill -9, a crash) is reported and
            # restarted, so a user can rehearse a failover on it.
            lines: list[str] = []
            if start_again.is_set():
                start_again.clear()  # first: a signal that comes while we act is the next turn's
                lines = cluster.supervisor.start_again() or ["SIGUSR1: no process was left down"]
            for line in [*lines, *cluster.supervise()]:
                print(f"{time.strftime('%H:%M:%S')} {line} (logs: {cluster.base_dir})", file=sys.stderr, flush=True)
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
    from fabric.local import ProcessStartError

    _require_zookeeper()
    try:
        return _demo(args)
    except ProcessStartError as exc:  # only the cluster's start raises it
        raise _start_error(exc) from None


def _demo(args: argparse.Namespace) -> int:
    from fabric.local import LocalCluster
    from sdk import Admin, Consumer, Producer, TopicPartition

    n = args.messages
    topic = "demo-events"
    print(f"== Fabric demo: ZooKeeper + {plural(args.nodes, 'storage node')}, {plural(n, 'message')} of "
          f"{plural(args.size, 'byte')}, "
          f"replication factor {min(3, args.nodes)}, acks=all, idempotent producer", flush=True)
    with LocalCluster(args.nodes, sequencer_count=2) as cluster:
        print(f"cluster up: ZooKeeper {cluster.zk_address}, nodes {sorted(cluster.nodes)}, "
              f"sequencers {sorted(cluster.sequencers)}", flush=True)
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(topic, partitions=args.partitions, replication_factor=min(3, args.nodes))
        filler = b"x" * (args.size - DEMO_SEQUENCE_BYTES)
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
        strict = _strict_order_demo(cluster.bootstrap, args.partitions, min(3, args.nodes))
        summary.update(strict)
        ok = ok and bool(strict["strict_order_ok"])
        group = _group_demo(cluster.bootstrap, topic, args.partitions, count)
        summary.update(group)
        ok = ok and bool(group["group_ok"])
        direct = _direct_demo(cluster.bootstrap)
        summary.update(direct)
        ok = ok and bool(direct["direct_ok"])
        queue = queue_demo(cluster.bootstrap)
        summary.update(queue)
        ok = ok and bool(queue["queue_ok"])
        moved = reassign_demo(cluster, topic)
        summary.update(moved)
        ok = ok and bool(moved["reassign_ok"]) and bool(moved["alter_ok"])
        print("== summary")
        print(f"  produced  {plural(n, 'message')} in {produce_s:.2f} s: {summary['produce_msgs_per_s']:,} msg/s, {summary['produce_mb_per_s']} MB/s")
        print(f"  consumed  {plural(count, 'message')} in {consume_s:.2f} s: {summary['consume_msgs_per_s']:,} msg/s, {summary['consume_mb_per_s']} MB/s")
        print(f"  verified  count {'OK' if count == n else 'MISMATCH'}, sha256 over per-partition order {'OK' if summary['checksum_match'] else 'MISMATCH'}")
        print(f"  strict    {plural(cast(int, strict['strict_order_records']), 'record')} from 4 producers into a strict-order topic; "
              f"2 ordered readers: same sequence {'OK' if strict['strict_order_readers_agree'] else 'MISMATCH'}, "
              f"global IDs increasing {'OK' if strict['strict_order_ids_increasing'] else 'MISMATCH'}")
        print(f"  group     2 members of group demo-billing split {plural(args.partitions, 'partition')} "
              f"{group['group_assignment']}, read {plural(cast(int, group['group_records']), 'record')}, committed offsets "
              f"at the log end {'OK' if group['group_committed_at_end'] else 'MISMATCH'}; one member paused "
              f"{plural(cast(int, group['group_paused_partitions']), 'partition')} for 5 polls and stayed in the group, "
              f"{plural(cast(int, group['group_records_while_paused']), 'record')} of them handed out meanwhile "
              f"{'OK' if group['group_paused_partitions'] and not group['group_records_while_paused'] else 'MISMATCH'}")
        print(f"  direct    {direct['direct_requests']:,} requests to 2 instances of service 'demo-echo', "
              f"p50 {direct['direct_p50_us']} us, p99 {direct['direct_p99_us']} us, per instance {direct['direct_per_instance']}; "
              f"gather: {plural(cast(int, direct['direct_gather_replies']), 'reply', 'replies')} "
              f"{'OK' if direct['direct_ok'] else 'MISMATCH'}")
        print(f"  queue     {queue['queue_jobs']:,} jobs to {queue['queue_workers']} competing workers, "
              f"{queue['queue_msgs_per_s']:,} msg/s: each acked once {'OK' if queue['queue_acked_once'] else 'MISMATCH'}, "
              f"{plural(cast(int, queue['queue_dead_letters']), 'poison job')} in the dead-letter queue, "
              f"delayed jobs early: {queue['queue_delayed_early']}, records left once consumed: "
              f"{queue['queue_records_left']}; {queue['queue_purged']} stale jobs purged (fabric queue purge), "
              f"{queue['queue_delivered_after_purge']} delivered after; group demo-workers deleted (fabric queue delete-group) "
              f"{_deleted_group_words(queue)} {'OK' if queue['queue_ok'] else 'MISMATCH'}")
        print(f"  operate   node {max(cluster.nodes)} joined; {topic}/0 moved {moved['reassign_from']} -> "
              f"{moved['reassign_to']} in {moved['reassign_seconds']} s ({moved['reassign_bytes']:,} bytes copied, "
              f"throttled): every record on the new node {'OK' if moved['reassign_ok'] else 'MISMATCH'}; "
              f"retention_ms altered to {moved['alter_retention_ms']:,} {'OK' if moved['alter_ok'] else 'MISMATCH'}")
        print(json.dumps(summary))
    return 0 if ok else 1


def _deleted_group_words(queue: dict[str, object]) -> str:
    """How the queue step's group deletion went, for the summary line."""
    if not queue["queue_group_deleted"]:
        return f"FAILED: {queue['queue_group_delete_refusal'] or 'still listed'}"
    partitions = cast(list[int], queue["queue_group_deleted_partitions"])
    tries = cast(int, queue["queue_group_delete_tries"])
    retried = f", after {plural(tries - 1, 'refusal')} while a closed worker's poll was parked" if tries > 1 else ""
    return f"from {plural(len(partitions), 'partition')}{retried}"


def _group_demo(bootstrap: str, topic: str, partitions: int, expected: int) -> dict[str, object]:
    """Two members of one consumer group share the topic's partitions and commit as they go."""
    from sdk import Admin, Consumer, TopicPartition

    group_id = "demo-billing"
    print(f"== consumer group: 2 members of {group_id} read {topic}", flush=True)
    members = [Consumer(bootstrap, group_id=group_id, auto_offset_reset="earliest", heartbeat_interval_ms=500,
                        session_timeout_ms=10_000) for _ in range(2)]
    seen = 0
    assignment: list[list[int]] = [[], []]
    paused: set[TopicPartition] = set()
    during_pause = 0  # records of paused partitions handed out while they were paused: none
    try:
        for member in members:
            member.subscribe([topic])
        # Read until everything is in and both members hold partitions: the second member's
        # share moves to it by cooperative rebalancing while the first keeps reading.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (seen < expected or not all(assignment)):
            for index, member in enumerate(members):
                batches = member.poll_batches(timeout_ms=100)
                seen += sum(len(batch) for batch in batches)
                assignment[index] = sorted(tp.partition for tp in member.assignment())
                if index == 0 and not paused and assignment[0]:
                    # Flow control, as Kafka's: the first member stops reading its
                    # partitions for a few polls, stays in the group, then reads on.
                    paused = set(member.assignment())
                    member.pause(paused)
                    for _ in range(5):
                        extra = member.poll_batches(timeout_ms=100)
                        seen += sum(len(batch) for batch in extra)
                        during_pause += sum(len(b) for b in extra if TopicPartition(b.topic, b.partition) in paused)
                    member.resume(member.paused())
        for member in members:
            member.commit()
    finally:
        for member in members:
            member.close()
    with Admin(bootstrap) as admin:
        description = admin.describe_group(group_id)
    # Every partition must have a commit at its log end: a partition with no commit has
    # no lag (None), and must not pass as caught up.
    at_end = (len(description.offsets) == partitions and all(p.lag == 0 for p in description.offsets)
              and seen >= expected)
    shared = all(assignment) and sorted(assignment[0] + assignment[1]) == list(range(partitions))
    return {"group_records": seen, "group_assignment": assignment, "group_committed_at_end": at_end,
            "group_paused_partitions": len(paused), "group_records_while_paused": during_pause,
            "group_ok": at_end and shared and bool(paused) and during_pause == 0}


def _direct_demo(bootstrap: str) -> dict[str, object]:
    """Two instances of a service on the direct plane: requests go peer to peer, no node in the path."""
    from sdk import Client

    requests = 2_000
    print(f"== direct plane: {requests:,} requests to 2 instances of demo-echo, then a scatter-gather", flush=True)
    with Client(bootstrap) as client:
        services = [client.serve("demo-echo", lambda request: request.payload, concurrency=16) for _ in range(2)]
        try:
            latencies_us: list[float] = []
            per_instance: dict[str, int] = {}
            wrong = 0
            for i in range(requests):
                payload = b"ping-%d" % i
                start = time.perf_counter()
                reply = client.request("demo-echo", payload, timeout_ms=2_000, idempotent=True)
                latencies_us.append((time.perf_counter() - start) * 1e6)
                wrong += reply.payload != payload
                per_instance[reply.instance] = per_instance.get(reply.instance, 0) + 1
            gathered = client.gather("demo-echo", b"health", timeout_ms=2_000)
        finally:
            for service in services:
                service.stop()
    latencies_us.sort()
    return {"direct_requests": requests, "direct_p50_us": round(latencies_us[len(latencies_us) // 2]),
            "direct_p99_us": round(latencies_us[int(len(latencies_us) * 0.99)]),
            "direct_per_instance": sorted(per_instance.values()), "direct_gather_replies": len(gathered.replies),
            "direct_ok": wrong == 0 and len(gathered.replies) == 2}


def _strict_order_demo(bootstrap: str, partitions: int, replication_factor: int) -> dict[str, object]:
    """A strict-order topic: 4 producers at once, two ordered readers that must agree."""
    from sdk import Admin, OrderedConsumer, Producer

    topic, producers, per_producer = "demo-ledger", 4, 2_500
    print(f"== strict order: {producers} producers x {per_producer:,} records into {topic} "
          f"({plural(partitions, 'partition')}), read back by 2 ordered readers", flush=True)
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=replication_factor, strict_order=True)

    def produce(index: int) -> None:
        with Producer(bootstrap, linger_ms=2) as producer:
            for i in range(per_producer):
                producer.send(topic, b"producer-%d entry-%d" % (index, i), key=b"account-%d" % (i % 100))
            producer.flush(timeout=120)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    total = producers * per_producer
    sequences: list[list[tuple[int, bytes]]] = []
    for _ in range(2):
        seen: list[tuple[int, bytes]] = []
        with OrderedConsumer(bootstrap, topic) as reader:
            deadline = time.monotonic() + 120
            while len(seen) < total and time.monotonic() < deadline:
                seen.extend((r.global_id, r.value or b"") for r in reader.poll(timeout_ms=500))
        sequences.append(seen)
    ids = [gid for gid, _ in sequences[0]]
    agree = sequences[0] == sequences[1] and len(sequences[0]) == total
    increasing = all(a < b for a, b in itertools.pairwise(ids))
    if ids:
        print(f"  first records in global order: {[f'#{g} {v.decode()}' for g, v in sequences[0][:3]]}")
    return {"strict_order_records": len(sequences[0]), "strict_order_readers_agree": agree,
            "strict_order_ids_increasing": increasing, "strict_order_ok": agree and increasing}


def cmd_node(argv: list[str]) -> int:
    if argv[:1] == ["drain"]:
        return cmd_node_drain(argv[1:])
    from nodes.launch import main as node_main

    return node_main(argv)


def cmd_node_drain(argv: list[str]) -> int:
    """``fabric node drain N``: a controlled shutdown of node N from anywhere (DRAIN_NODE)."""
    from fabric.cli import run_guarded

    parser = with_bootstrap(Parser(
        prog="fabric node drain",
        description="Move node N's leaderships to other in-sync replicas, then stop it (as SIGTERM does)."))
    parser.add_argument("node_id", type=node_id, help="the node to drain")
    args = parser.parse_args(argv)
    debug = os.environ.get("FABRIC_DEBUG", "") not in ("", "0")
    quiet_libraries(debug)
    return run_guarded(_drain, args, debug)


def _drain(args: argparse.Namespace) -> int:
    from sdk import Admin

    with Admin(bootstrap(args)) as admin:
        led = admin.drain_node(args.node_id)
    print(f"node {args.node_id} is draining: {plural(led, 'leadership')} to move to in-sync replicas, then it stops")
    return 0

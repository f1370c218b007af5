"""The control plane with many partitions: a local three-node cluster grown to 2,000.

    python -m bench.partitions_scale [--partitions 2000] [--topic-partitions 10] [--repeats 3]

Kafka users run thousands of partitions per cluster; this measures what Fabric's control
plane does there, with real processes (ZooKeeper, three nodes, the SDK and the CLI):

1. Creating topics of ``--topic-partitions`` partitions (RF 3) until the cluster holds
   100, 500 and ``--partitions`` partitions: the median time of the last ten
   ``Admin.create_topic`` calls before each mark (each returns once every partition has
   a leader that serves), and of ``--repeats`` ``fabric topic create`` commands there
   (a new process each: interpreter start-up included).
2. At the end: METADATA for every topic (answer bytes and time), a new producer's first
   acknowledged send, a consumer's ``assign`` of every partition and its first poll, and
   ``fabric topic list``, ``fabric status``, ``fabric topic describe`` (one topic, all).
3. ZooKeeper's znode and watch counts (``mntr``) and each node's idle CPU and RSS, with
   no partition and with all of them.
4. ``fabric topic elect-leaders``' work (``Admin.elect_preferred_leaders``), then node 1
   stopped with SIGTERM (a controlled shutdown: its leaderships move first) and with
   SIGKILL: the time until every partition it led has another leader, how many went
   offline (no leader: an in-sync replica set with no live member), and after a restart
   the time until every partition has its full ISR again.

Timings on a shared two-core machine are noisy: the creates are medians of ten, the
commands medians of ``--repeats``. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from bench._cli import json_line, positive_int, run
from bench.stats import median
from fabric.local import LocalCluster, LocalZooKeeper
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from sdk import Admin, Consumer, Producer, TopicPartition

MARKS = (100, 500)  # partition counts reported on the way to --partitions
SESSION_TIMEOUT_MS = 6_000  # LocalCluster's default, as `fabric up` nodes use
IDLE_SAMPLE_S = 20.0  # node CPU is averaged over this long with nothing to do
CREATES_PER_MARK = 10  # the create times reported at a mark are the median of the last this many
RECOVERY_WAIT_S_MAX = 120.0  # a failover or restart not done by then is reported as not done


def zk_mntr(address: str) -> dict[str, str]:
    """ZooKeeper's ``mntr`` four-letter command, as a dict."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"mntr")
        out = b""
        while chunk := conn.recv(65536):
            out += chunk
    return dict(line.split("\t", 1) for line in out.decode().splitlines() if "\t" in line)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def idle_nodes(cluster: LocalCluster, seconds: float = IDLE_SAMPLE_S) -> dict[str, float]:
    """Median over the nodes of CPU (percent of one core) and RSS while nobody asks anything."""
    pids = [node.process.pid for node in cluster.nodes.values()]
    before = [cpu_seconds(pid) for pid in pids]
    time.sleep(seconds)
    cpu = [100.0 * (cpu_seconds(pid) - b) / seconds for pid, b in zip(pids, before, strict=True)]
    return {"cpu_percent": round(median(cpu), 1), "rss_mib": round(median([rss_mib(pid) for pid in pids]), 1)}


def cli_s(cluster: LocalCluster, *args: str) -> float:
    """Wall time of one ``fabric`` command (a new process); it must succeed."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "fabric", *args, "--bootstrap", cluster.bootstrap],
                            capture_output=True, text=True, check=False)
    elapsed_s = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"fabric {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()[-300:]}")
    return elapsed_s


def metadata_all(address: str) -> tuple[float, int]:
    """One METADATA request for every topic, straight over a DEALER: seconds and answer bytes."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    try:
        started = time.perf_counter()
        dealer.send_multipart(apis.encode_request(ApiKey.METADATA, {"topics": []}, 1))
        if not dealer.poll(30_000):
            raise SystemExit(f"METADATA to {address}: no answer in 30 s")
        frames = dealer.recv_multipart()
        return time.perf_counter() - started, sum(len(f) for f in frames)
    finally:
        dealer.close()


def partition_leaders(admin: Admin) -> dict[tuple[str, int], tuple[int, bool]]:
    """(topic, partition) -> (leader, ISR full)."""
    return {(d.name, p.partition): (p.leader, set(p.isr) == set(p.replicas))
            for d in admin.describe_topics() for p in d.partitions}


def wait_until(check: Any, limit_s: float = RECOVERY_WAIT_S_MAX, pause_s: float = 0.1) -> float | None:
    """Seconds until ``check()`` is true, polled; None if not within ``limit_s``."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        if check():
            return time.perf_counter() - started
        time.sleep(pause_s)
    return None


def node_loss(cluster: LocalCluster, admin: Admin, how: str) -> dict[str, Any]:
    """Stop node 1 (``term``: controlled, ``kill``: SIGKILL) after a preferred election,
    and time the move of its leaderships, then its restart."""
    admin.elect_preferred_leaders()
    # The nodes' routing maps (which DESCRIBE_TOPICS answers from) follow the controller's
    # writes by watch: wait until they show node 1 leading what it prefers to.
    preferred = {(d.name, p.partition) for d in admin.describe_topics() for p in d.partitions if p.replicas[0] == 1}
    wait_until(lambda: {tp for tp, (leader, _full) in partition_leaders(admin).items() if leader == 1} >= preferred,
               limit_s=30.0)
    led = [tp for tp, (leader, _full) in partition_leaders(admin).items() if leader == 1]
    node = cluster.nodes[1]
    started = time.perf_counter()
    if how == "term":
        node.stop()
    else:
        node.kill()
    stopped_s = time.perf_counter() - started

    def moved() -> bool:
        leaders = partition_leaders(admin)
        return all(leaders[tp][0] not in (1, -1) for tp in led)

    moved_s = wait_until(moved)
    leaders = partition_leaders(admin)
    offline = sum(1 for tp in led if leaders[tp][0] == -1)
    started = time.perf_counter()
    node.start()
    cluster.wait_for_nodes([1])
    registered_s = time.perf_counter() - started
    full_s = wait_until(lambda: all(leader >= 0 and full for leader, full in partition_leaders(admin).values()),
                        pause_s=0.2)
    return {"led": len(led), "stop_s": round(stopped_s, 2), "moved_s": None if moved_s is None else round(moved_s, 2),
            "offline_after_move": offline, "restart_registered_s": round(registered_s, 2),
            "restart_full_isr_s": None if full_s is None else round(full_s + registered_s, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.partitions_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=positive_int, default=2_000, help="grow the cluster to this many partitions")
    parser.add_argument("--topic-partitions", type=positive_int, default=10, help="partitions per topic (RF 3)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs of each CLI command; the median is reported")
    parser.add_argument("--no-node-loss", action="store_true", help="skip the SIGTERM and SIGKILL of node 1")
    args = parser.parse_args(argv)
    per_topic = args.topic_partitions
    figures: dict[str, Any] = {"bench": "partitions_scale", "partitions": args.partitions, "topic_partitions": per_topic,
                               "replication_factor": 3, "session_timeout_ms": SESSION_TIMEOUT_MS}
    with tempfile.TemporaryDirectory(prefix="fabric-bench-") as tmp:
        zookeeper = LocalZooKeeper(Path(tmp))
        zookeeper.start()
        try:
            with LocalCluster(3, Path(tmp) / "cluster", zk_address=zookeeper.address, chroot="/fabric-scale",
                              session_timeout_ms=SESSION_TIMEOUT_MS) as cluster, Admin(cluster.bootstrap) as admin:
                figures["idle_empty"] = idle_nodes(cluster)
                print(f"three nodes, no partition: idle {figures['idle_empty']}", flush=True)
                total = 0
                created: list[float] = []  # seconds per Admin.create_topic
                marks = sorted({m for m in MARKS if m < args.partitions} | {args.partitions})
                for mark in marks:
                    while total + per_topic <= mark:
                        started = time.perf_counter()
                        admin.create_topic(f"t{len(created):05d}", per_topic, 3)
                        created.append(time.perf_counter() - started)
                        total += per_topic
                    cli = [cli_s(cluster, "topic", "create", f"cli-{mark}-{i}", "--partitions", str(per_topic))
                           for i in range(args.repeats)]
                    total += per_topic * args.repeats
                    figures[f"create_ms_at_{mark}"] = round(1000 * median(created[-CREATES_PER_MARK:]))
                    figures[f"cli_create_ms_at_{mark}"] = round(1000 * median(cli))
                    print(f"{total:>5} partitions: Admin.create_topic median {figures[f'create_ms_at_{mark}']} ms "
                          f"(last {CREATES_PER_MARK}), fabric topic create median {figures[f'cli_create_ms_at_{mark}']} ms",
                          flush=True)
                figures["partitions_total"] = total
                address = next(iter(admin.nodes().values()))
                runs = [metadata_all(address) for _ in range(5)]
                figures["metadata_all_ms"] = round(1000 * median([s for s, _ in runs]), 1)
                figures["metadata_all_bytes"] = runs[-1][1]
                times = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    with Producer(cluster.bootstrap) as producer:
                        producer.send("t00000", b"x").result(30)
                        times.append(time.perf_counter() - started)
                figures["producer_first_send_ms"] = round(1000 * median(times))
                tps = [TopicPartition(f"t{i:05d}", p) for i in range(len(created)) for p in range(per_topic)]
                with Consumer(cluster.bootstrap) as consumer:
                    started = time.perf_counter()
                    consumer.assign(tps)
                    assigned = time.perf_counter()
                    consumer.poll(timeout_ms=0)
                    polled = time.perf_counter()
                figures["consumer_assign_ms"] = round(1000 * (assigned - started))
                figures["consumer_first_poll_ms"] = round(1000 * (polled - assigned))
                print(f"METADATA of everything: {figures['metadata_all_ms']} ms, {figures['metadata_all_bytes']:,} bytes; "
                      f"a producer's first send {figures['producer_first_send_ms']} ms; assign {len(tps)} partitions "
                      f"{figures['consumer_assign_ms']} ms, first poll {figures['consumer_first_poll_ms']} ms", flush=True)
                for key, command in (("cli_topic_list_ms", ("topic", "list")), ("cli_status_ms", ("status",)),
                                     ("cli_describe_one_ms", ("topic", "describe", "t00000")),
                                     ("cli_describe_all_ms", ("topic", "describe"))):
                    figures[key] = round(1000 * median([cli_s(cluster, *command) for _ in range(args.repeats)]))
                    print(f"fabric {' '.join(command)}: {figures[key]} ms", flush=True)
                mntr = zk_mntr(zookeeper.address)
                figures["zk_znodes"] = int(mntr["zk_znode_count"])
                figures["zk_watches"] = int(mntr["zk_watch_count"])
                figures["idle_full"] = idle_nodes(cluster)
                print(f"ZooKeeper: {figures['zk_znodes']} znodes, {figures['zk_watches']} watches; nodes idle "
                      f"{figures['idle_full']}", flush=True)
                started = time.perf_counter()
                admin.elect_preferred_leaders()
                figures["elect_preferred_ms"] = round(1000 * (time.perf_counter() - started))
                if not args.no_node_loss:
                    for how in ("term", "kill"):
                        figures[f"node_{how}"] = loss = node_loss(cluster, admin, how)
                        print(f"node 1 {how}: {loss}", flush=True)
        finally:
            zookeeper.stop()
    print(json_line(figures))
    return 0


if __name__ == "__main__":
    run(main)

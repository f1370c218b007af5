#!/usr/bin/env python3
"""Rolling upgrade from an older release to this tree, on real processes, then a rollback.

    python3 scripts/upgrade_check.py [--old-commit ed15b0f] [--work-dir DIR]

Builds the old release with ``git worktree add`` (pure Python: FABRIC_PURE_PYTHON=1), starts
three of its nodes, and prepares: a replicated topic (RF 3, min_insync 2), a consumer group
with committed offsets and metadata, a queue group with messages acked, nacked with a
30-minute delay, dead-lettered and held. Under load (an acks=all idempotent producer of
this tree's SDK and one of the old SDK, a reader, a queue producer, a queue worker of each
SDK), each node in turn gets SIGTERM (drain) and is started from this tree on the same data
dir and ports; full ISR and preferred leaders are restored before the next. Then node 3 is
rolled back to the old release. Checks: nothing acknowledged lost or duplicated, offsets
and queue state as prepared, nothing acked delivered again. Exit status 1 if any fails.
The procedure and what it measured: docs/OPERATIONS.md, "Upgrades". About 90 s.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
QUEUE_DELAY_MS = 30 * 60 * 1000  # the nacked messages stay delayed for the whole run
SETTLE_S = 8.0  # load between the steps


def worker(mode: str, bootstrap: str, name: str, out_path: str) -> None:
    """A queue worker (mode "queue") or topic writer ("write") on whichever SDK PYTHONPATH
    names, logging JSON lines; stops when ``out_path``.stop exists."""
    from sdk import Producer, QueueConsumer

    stop_file = Path(out_path + ".stop")
    with open(out_path, "a", buffering=1) as out:
        def emit(**fields: Any) -> None:
            out.write(json.dumps({**fields, "t": time.time()}) + "\n")

        if mode == "queue":
            consumer = QueueConsumer(bootstrap, "q", "qg", consumer_id=name, visibility_timeout_ms=20_000)
            while not stop_file.exists():
                try:
                    messages = consumer.receive(10, wait_ms=500)
                except Exception as exc:
                    emit(ev="error", err=repr(exc)[:200])
                    time.sleep(0.5)
                    continue
                for m in messages:
                    emit(ev="recv", p=m.partition, o=m.offset, dc=m.delivery_count, v=(m.value or b"").decode())
                if not messages:
                    continue
                try:
                    consumer.ack(messages)
                    lost: set[tuple[int, int]] = set()
                except Exception as exc:  # LeaseNotHeldError: the others were acked
                    lost = {(x.partition, x.offset) for x in getattr(exc, "lost", messages)}
                    emit(ev="ackerr", err=repr(exc)[:200])
                for m in messages:
                    if (m.partition, m.offset) not in lost:
                        emit(ev="ack", v=(m.value or b"").decode())
            emit(ev="v0", nodes=sorted(getattr(consumer, "_receive_v0", [])))
            consumer.close()
            return
        producer = Producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=2,
                            delivery_timeout_ms=180_000, request_timeout_ms=10_000)
        started_s, i = time.monotonic(), 0
        while not stop_file.exists():
            value = f"{name}-{i}"
            emit(ev="sent", v=value)
            producer.send("log", value.encode(), key=b"k%d" % (i % 97)).add_callback(
                lambda meta, exc, v=value: emit(ev="ack", v=v, p=meta.partition, o=meta.offset) if exc is None
                else emit(ev="fail", v=v, err=repr(exc)[:200]))
            i += 1
            time.sleep(max(0.0, i / 100 - (time.monotonic() - started_s)))  # 100 records/s
        producer.flush(timeout=180)
        producer.close(timeout=30)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-commit", default="ed15b0f")
    parser.add_argument("--work-dir", default="")
    parser.add_argument("--worker", nargs=4, metavar=("MODE", "BOOTSTRAP", "NAME", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fabric-upgrade-"))
    old_tree = work / "old"
    if not old_tree.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old_tree), args.old_commit], check=True)
    try:
        return run(work, old_tree)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)], check=False)


def run(work: Path, old_tree: Path) -> int:
    sys.path.insert(0, str(REPO))
    # `python -m nodes` puts the working directory first on sys.path: from the repo, the old
    # release's nodes would import this tree's code.
    os.chdir(work)
    from fabric.local import LocalCluster
    from sdk import Admin, Consumer, OffsetAndMetadata, Producer, QueueConsumer, TopicPartition
    from tests.fault.harness import (
        Reader,
        Writer,
        collect_replicas,
        read_everything,
        wait_for_full_isr,
    )
    from tests.fault.history import History, check

    started_s = time.monotonic()
    problems: list[str] = []

    def say(*parts: object) -> None:
        print(f"[{time.monotonic() - started_s:6.1f} s]", *parts, flush=True)

    trees = {"old": str(old_tree), "new": str(REPO)}
    env = {name: {"PYTHONPATH": tree, "FABRIC_PURE_PYTHON": "1"} for name, tree in trees.items()}
    release: dict[int, str] = {}
    cluster = LocalCluster(node_count=0, base_dir=work / "cluster", session_timeout_ms=4_000, stable_ports=True,
                           node_args=["--replica-lag-max-ms", "1500"])
    cluster.start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for node_id in (1, 2, 3):
            cluster.add_node(node_id, wait=False, env=env["old"])
            release[node_id] = "old"
        cluster.wait_for_nodes([1, 2, 3])
        bs = cluster.bootstrap
        topics = ["log", "q", "qp"]
        with Admin(bs) as admin:
            admin.create_topic("log", partitions=6, replication_factor=3, config={"min_insync": 2})
            admin.create_queue("q", partitions=3, replication_factor=3, max_deliveries=5)
            admin.create_topic("qp-dlq", partitions=1, replication_factor=3, config={"min_insync": 2})
            admin.create_queue("qp", partitions=3, replication_factor=3, max_deliveries=2, dead_letter="qp-dlq")
        # Queue state of group "prep" on qp: 0-19 acked, 20-34 delayed, 35-44 dead, 45-59 held.
        with Producer(bs, acks="all") as producer:
            for i in range(60):
                producer.send("qp", f"qp-{i}".encode(), key=b"%d" % i)
            producer.flush(30)
        prep = QueueConsumer(bs, "qp", "prep", consumer_id="prep", visibility_timeout_ms=12 * 3600 * 1000)
        dead: set[int] = set()
        seen: set[int] = set()
        deadline_s = time.monotonic() + 60
        while time.monotonic() < deadline_s and (len(seen) < 60 or len(dead) < 10):
            for m in prep.receive(20, wait_ms=500):
                i = int((m.value or b"").decode().split("-")[1])
                seen.add(i)
                if i < 20:
                    prep.ack(m)
                elif i < 35:
                    prep.nack(m, delay_ms=QUEUE_DELAY_MS)
                elif i < 45:
                    prep.nack(m)
                    if m.delivery_count >= 2:
                        dead.add(i)
        say("new SDK against old nodes: QUEUE_RECEIVE v0 fallback for", len(prep._receive_v0), "nodes")
        prep.close()
        expected_prep = {"delayed": 15, "dead_lettered": 10, "held": 15}
        committed = {TopicPartition("log", p): OffsetAndMetadata(10 + p, f"meta-{p}", None) for p in range(6)}
        with Producer(bs, acks="all") as producer:
            for i in range(60):
                producer.send("log", b"seed-%d" % i, partition=i % 6)
            producer.flush(30)
        with Consumer(bs, group_id="cg") as consumer:
            consumer.assign(list(committed))
            consumer.commit(committed)

        def check_state(label: str) -> None:
            with Consumer(bs, group_id="cg") as consumer:
                offsets = {tp: consumer.committed(tp, metadata=True) for tp in committed}
            if any((o.offset, o.metadata) != (committed[tp].offset, committed[tp].metadata) for tp, o in offsets.items()
                   if o is not None) or None in offsets.values():
                problems.append(f"{label}: group offsets {offsets}")
            with Admin(bs) as admin:
                d = admin.describe_queue("qp", "prep")
            counts = {k: d.total(k) for k in ("visible", "in_flight", "delayed", "dead_lettered")}
            with Consumer(bs) as reader:
                dlq = TopicPartition("qp-dlq", 0)
                counts["dlq_records"] = reader.end_offsets([dlq])[dlq]
            if counts["delayed"] != 15 or counts["dead_lettered"] != 10 or counts["dlq_records"] != 10 or counts["visible"] + counts["in_flight"] != 15:
                problems.append(f"{label}: qp/prep counts {counts}, expected {expected_prep}")
            say(label, release, "qp/prep", counts, "log acked", len(history.acked))

        history = History()
        writer = Writer(bs, "log", history, count=10**9, rate_per_s=150, name="n")
        reader = Reader(bs, "log", 6, history)
        writer.start()
        reader.start()
        for name, mode, tree in (("o", "write", "old"), ("oldw", "queue", "old"), ("neww", "queue", "new")):
            procs[name] = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", mode, bs, name, str(work / f"{name}.jsonl")],
                env={**os.environ, **env[tree]}, stdout=subprocess.DEVNULL, stderr=open(work / f"{name}.err", "wb"))  # noqa: SIM115 (the child holds it)
        queue_sent: set[str] = set()
        queue_stop = threading.Event()

        def produce_queue() -> None:
            with Producer(bs, acks="all", enable_idempotence=True) as producer:
                i = 0
                while not queue_stop.is_set():
                    value = f"qm-{i}"
                    producer.send("q", value.encode(), key=b"%d" % i).add_callback(
                        lambda _meta, exc, v=value: queue_sent.add(v) if exc is None else None)
                    i += 1
                    time.sleep(1 / 60)
                producer.flush(120)

        queue_thread = threading.Thread(target=produce_queue, daemon=True)
        queue_thread.start()
        phases = [("all old", time.time())]

        def roll(node_id: int, to: str) -> None:
            began_s = time.monotonic()
            node = cluster.nodes[node_id]
            node.stop()  # SIGTERM: leaderships move first
            node.process.env = {**os.environ, **env[to]}
            node.start()  # same data dir, same ports (stable_ports)
            cluster.wait_for_nodes([node_id])
            release[node_id] = to
            for topic in [*topics, "__queue_state", "__consumer_offsets"]:
                wait_for_full_isr(bs, topic, timeout_s=120)
            with Admin(bs) as admin:
                admin.elect_preferred_leaders([*topics, "__queue_state", "__consumer_offsets"])
            say(f"node {node_id} -> {to} in {time.monotonic() - began_s:.1f} s")

        time.sleep(SETTLE_S)
        check_state("all old")
        for node_id in (1, 2, 3):
            roll(node_id, "new")
            phases.append((f"node {node_id} new", time.time()))
            time.sleep(SETTLE_S)
            check_state(f"node {node_id} new")
        roll(3, "old")
        phases.append(("node 3 rolled back", time.time()))
        time.sleep(SETTLE_S)
        check_state("node 3 rolled back")

        for name in procs:
            (work / f"{name}.jsonl.stop").touch()
        queue_stop.set()
        writer.stop_flag.set()
        writer.join(240)
        queue_thread.join(150)
        for proc in procs.values():
            proc.wait(200)
        read_everything(bs, "log", 6, history)
        reader.stop_flag.set()
        reader.join(30)
        acks_by_phase: collections.Counter[str] = collections.Counter()
        for e in read_lines(work / "o.jsonl"):
            if e["ev"] == "sent":
                history.sent.add(e["v"].encode())
            elif e["ev"] == "ack":
                history.acked[e["v"].encode()] = (e["p"], e["o"])
                acks_by_phase[[label for label, t in phases if t <= e["t"]][-1]] += 1
        say("old-SDK producer acks per phase", dict(acks_by_phase))
        visible_prep: set[int] = set()
        with_final = QueueConsumer(bs, "qp", "prep", consumer_id="final")
        end_s = time.monotonic() + 10
        while time.monotonic() < end_s:
            visible_prep.update(int((m.value or b"").decode().split("-")[1]) for m in with_final.receive(50, wait_ms=300))
        with_final.close()
        if visible_prep != set(range(45, 60)):
            problems.append(f"qp/prep delivered {sorted(visible_prep)} at the end, expected only the held 45..59")
        events = sorted((e | {"w": name} for name in ("oldw", "neww") for e in read_lines(work / f"{name}.jsonl")),
                        key=lambda e: e["t"])
        acked_q: dict[str, str] = {}
        again: list[str] = []
        for e in events:
            if e["ev"] == "recv" and e["v"] in acked_q:
                again.append(e["v"])
            elif e["ev"] == "ack":
                acked_q.setdefault(e["v"], e["w"])
        left: set[str] = set()
        drain = QueueConsumer(bs, "q", "qg", consumer_id="drain")
        end_s = time.monotonic() + 15
        while time.monotonic() < end_s:
            messages = drain.receive(100, wait_ms=300)
            left.update((m.value or b"").decode() for m in messages)
            if messages:
                drain.ack(messages)
        drain.close()
        missing = queue_sent - set(acked_q) - left
        per_worker = collections.Counter(f"{e['w']}.{e['ev']}" for e in events)
        say("queue q: sent", len(queue_sent), "acked by workers", len(acked_q), "per worker", dict(per_worker),
            "delivered again after ack", len(again), "missing", len(missing))
        say("v0 fallback left at the end:", [(e["w"], len(e["nodes"])) for e in events if e["ev"] == "v0"])
        if again or missing:
            problems.append(f"queue q: {len(again)} delivered after ack {again[:3]}, {len(missing)} missing {sorted(missing)[:3]}")
        collect_replicas(cluster, "log", 6, history)
        report = check(history)
        seed = {f"seed-{i}".encode() for i in range(60)}
        report.unexpected = [v for v in report.unexpected if v not in seed]
        say("log:", report.summary())
        if not report.ok():
            problems.append(report.summary())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        cluster.stop()
    for problem in problems:
        print("PROBLEM:", problem)
    print("OK" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Rolling upgrade from an older release to this tree, on real processes, then a rollback.

    python3 scripts/upgrade_check.py [--old-commit ed15b0f] [--work-dir DIR]

Builds the old release with ``git worktree add`` (pure Python: FABRIC_PURE_PYTHON=1), starts
three of its nodes and two of its sequencers, and prepares: a replicated topic (RF 3,
min_insync 2), a strict-order topic (4 partitions, RF 3, min_insync 2), a consumer group
with committed offsets and metadata, a queue group with messages acked, nacked with a
30-minute delay, dead-lettered and held. Under load (an acks=all idempotent producer of
this tree's SDK and one of the old SDK on each of the two topics, a reader, an
OrderedConsumer of this tree on the strict-order topic, a queue producer, a queue worker
of each SDK), each node in turn gets SIGTERM (drain) and is started from this tree on the
same data dir and ports; full ISR and preferred leaders are restored before the next.
Then the sequencers, one by one: the standby first, then the active one (one failover).
Then node 3 is rolled back to the old release, and one sequencer too, made the active
one. Checks: nothing acknowledged lost or duplicated, offsets and queue state as
prepared, nothing acked delivered again; on the strict-order topic every acknowledged
record read exactly once by the live ordered reader, at its acknowledged offset, global
IDs strictly increasing, each producer's records of a partition in send order, and a
fresh ordered reader from the beginning reading the live reader's sequence (or a longer
one it begins). Exit status 1 if any fails. The procedure and what it measured:
docs/OPERATIONS.md, "Upgrades". About 2 minutes.
"""

from __future__ import annotations

import argparse
import collections
import itertools
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
STRICT_PARTITIONS = 4
STRICT_RATE = 50  # records/s of each strict-order producer


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
                    unknown = [[x.partition, x.offset] for x in getattr(exc, "unknown", [])]  # this tree's SDK
                    emit(ev="ackerr", err=repr(exc)[:200], lost=sorted(lost), unknown=unknown)
                for m in messages:
                    if (m.partition, m.offset) not in lost:
                        emit(ev="ack", v=(m.value or b"").decode())
            emit(ev="v0", nodes=sorted(getattr(consumer, "_receive_v0", [])))
            consumer.close()
            return
        # mode "write": topic "log" at 100 records/s; "strict": the strict-order topic at STRICT_RATE.
        topic, rate = ("ledger", STRICT_RATE) if mode == "strict" else ("log", 100)
        producer = Producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=2,
                            delivery_timeout_ms=180_000, request_timeout_ms=10_000)
        started_s, i = time.monotonic(), 0
        while not stop_file.exists():
            value = f"{name}-{i}"
            emit(ev="sent", v=value)
            producer.send(topic, value.encode(), key=b"k%d" % (i % 97)).add_callback(
                lambda meta, exc, v=value: emit(ev="ack", v=v, p=meta.partition, o=meta.offset) if exc is None
                else emit(ev="fail", v=v, err=repr(exc)[:200]))
            i += 1
            time.sleep(max(0.0, i / rate - (time.monotonic() - started_s)))
        producer.flush(timeout=180)
        producer.close(timeout=30)


class OrderedReader(threading.Thread):
    """An OrderedConsumer of this tree reading the strict-order topic all along, recording
    (global ID, partition, offset, value) in the order it delivers."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from sdk import OrderedConsumer

        super().__init__(name="ordered-live", daemon=True)
        self.consumer = OrderedConsumer(bootstrap, topic, fetch_max_wait_ms=200)
        self.seen: list[tuple[int, int, int, bytes]] = []
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                self.seen.extend((r.global_id, r.partition, r.offset, r.value or b"")
                                 for r in self.consumer.poll(timeout_ms=200))
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()


def read_ordered(bootstrap: str, topic: str, want: int, timeout_s: float = 60) -> list[tuple[int, int, int, bytes]]:
    """A fresh OrderedConsumer from the beginning: at least ``want`` records, then until it
    has been quiet for 2 s (or ``timeout_s``)."""
    from sdk import OrderedConsumer

    seen: list[tuple[int, int, int, bytes]] = []
    with OrderedConsumer(bootstrap, topic, fetch_max_wait_ms=200) as consumer:
        deadline_s = time.monotonic() + timeout_s
        quiet_since_s = time.monotonic()
        while time.monotonic() < deadline_s:
            records = consumer.poll(timeout_ms=300)
            seen.extend((r.global_id, r.partition, r.offset, r.value or b"") for r in records)
            if records:
                quiet_since_s = time.monotonic()
            elif len(seen) >= want and time.monotonic() - quiet_since_s > 2.0:
                break
    return seen


def check_strict(acked: dict[bytes, tuple[int, int]], live: list[tuple[int, int, int, bytes]],
                 fresh: list[tuple[int, int, int, bytes]], labels: list[str]) -> list[str]:
    """The strict-order checks of the module docstring; one line per kind of problem."""
    problems: list[str] = []
    where = {value: (p, o) for _gid, p, o, value in live}
    counts = collections.Counter(value for *_rest, value in live)
    twice = [v for v, n in counts.items() if n > 1]
    if twice:
        problems.append(f"ordered reader read {len(twice)} records more than once, e.g. {twice[:3]}")
    missing = [v for v in acked if v not in where]
    if missing:
        problems.append(f"{len(missing)} acknowledged strict-order records never read in order, e.g. {missing[:3]}")
    moved = [(v, acked[v], where[v]) for v in acked if v in where and where[v] != acked[v]]
    if moved:
        problems.append(f"{len(moved)} strict-order records read at another place than acknowledged, e.g. {moved[:3]}")
    ids = [gid for gid, *_rest in live]
    not_rising = sum(1 for a, b in itertools.pairwise(ids) if b <= a)
    if not_rising:
        problems.append(f"ordered reader: global IDs not strictly increasing {not_rising} times")
    for label in labels:
        prefix = f"{label}-".encode()
        last: dict[int, int] = {}
        for _gid, p, _o, value in live:
            if value.startswith(prefix):
                i = int(value[len(prefix):])
                if i <= last.get(p, -1):
                    problems.append(f"ordered reader: {label} partition {p}: send {i} read after send {last[p]}")
                    break
                last[p] = i
    if fresh[:len(live)] != live:
        first = next((k for k, (a, b) in enumerate(zip(live, fresh, strict=False)) if a != b), min(len(live), len(fresh)))
        problems.append(f"fresh ordered reader ({len(fresh)} records) does not begin with the live reader's "
                        f"{len(live)}: first difference at {first}")
    return problems


def queue_states(data_dir: Path, queue: str, group: str, positions: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The last state ``__queue_state`` holds for each (partition, offset) of ``queue`` in
    ``group``, read from a stopped node's store."""
    from fabric.protocol import batch as batch_format
    from fabric.protocol import queues as qp
    from nodes.log import Store

    keys = {qp.state_key(queue, p, group): p for p in {p for p, _o in positions}}
    found: dict[tuple[int, int], str] = {}
    store = Store(str(data_dir / "rocksdb"))
    try:
        for k in range(256):
            batches = store.stored_batches(qp.STATE_TOPIC, k)
            for base in sorted(batches):
                if batch_format.read_header(batches[base]).attributes & batch_format.ATTRIBUTE_CONTROL:
                    continue
                decoded = batch_format.decode_batch(batches[base], check_crc=False)
                for key, value in zip(decoded.keys, decoded.values, strict=True):
                    if key not in keys or value is None:
                        continue
                    try:
                        record = qp.decode_state_record(value)
                    except Exception:  # a group record, not a message's
                        continue
                    for p, o in positions:
                        if p == keys[key] and record["offset"] <= o <= record["last_offset"]:
                            found[(p, o)] = record["state"]
    finally:
        store.close()
    return found


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
    from fabric.local import LocalCluster, LocalSequencer
    from sdk import Admin, Consumer, OffsetAndMetadata, Producer, QueueConsumer, TopicPartition
    from tests.fault.harness import (
        Reader,
        Writer,
        collect_replicas,
        read_everything,
        wait_for_full_isr,
    )
    from tests.fault.history import History, check, divergence, producer_order

    started_s = time.monotonic()
    problems: list[str] = []

    def say(*parts: object) -> None:
        print(f"[{time.monotonic() - started_s:6.1f} s]", *parts, flush=True)

    trees = {"old": str(old_tree), "new": str(REPO)}
    env = {name: {"PYTHONPATH": tree, "FABRIC_PURE_PYTHON": "1"} for name, tree in trees.items()}
    release: dict[int | str, str] = {}  # node id, or "s<id>" for a sequencer -> "old" / "new"
    cluster = LocalCluster(node_count=0, base_dir=work / "cluster", session_timeout_ms=4_000, stable_ports=True,
                           node_args=["--replica-lag-max-ms", "1500"])
    cluster.start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for node_id in (1, 2, 3):
            cluster.add_node(node_id, wait=False, env=env["old"])
            release[node_id] = "old"
        cluster.wait_for_nodes([1, 2, 3])
        for sequencer_id in (1, 2):  # as LocalCluster.start does, each from the old release's tree
            sequencer = LocalSequencer(sequencer_id, cluster.zk_address, cluster.base_dir, cluster.session_timeout_ms)
            sequencer.process.env = {**os.environ, **env["old"]}
            cluster.sequencers[sequencer_id] = sequencer
            sequencer.start()
            release[f"s{sequencer_id}"] = "old"
        cluster.wait_for_active_sequencer()
        bs = cluster.bootstrap
        topics = ["log", "q", "qp", "ledger"]
        with Admin(bs) as admin:
            admin.create_topic("log", partitions=6, replication_factor=3, config={"min_insync": 2})
            admin.create_topic("ledger", partitions=STRICT_PARTITIONS, replication_factor=3,
                               config={"min_insync": 2}, strict_order=True)
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
        strict = History()
        ordered = OrderedReader(bs, "ledger")
        ordered.start()
        strict_writer = Writer(bs, "ledger", strict, count=10**9, rate_per_s=STRICT_RATE, name="ns")
        writer.start()
        reader.start()
        strict_writer.start()
        for name, mode, tree in (("o", "write", "old"), ("os", "strict", "old"), ("oldw", "queue", "old"),
                                 ("neww", "queue", "new")):
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

        def roll_sequencer(sequencer_id: int, to: str) -> None:
            """SIGTERM (an active instance deletes its znode: the standby takes over), start
            from ``to``'s tree, wait until it stands by (or is active) again."""
            began_s = time.monotonic()
            sequencer = cluster.sequencers[sequencer_id]
            was_active = cluster.active_sequencer() == sequencer_id
            log = sequencer.process.log_path
            standing_before = log.read_text(errors="replace").count("standing by")
            sequencer.stop()
            took_over = ""
            if was_active:
                other = cluster.wait_for_active_sequencer(other_than=sequencer_id, timeout_s=60)
                took_over = f", sequencer {other} active after {time.monotonic() - began_s:.2f} s"
            sequencer.process.env = {**os.environ, **env[to]}
            sequencer.start()
            deadline_s = time.monotonic() + 60
            while log.read_text(errors="replace").count("standing by") <= standing_before:
                if time.monotonic() > deadline_s or not sequencer.process.running:
                    raise RuntimeError(f"sequencer {sequencer_id} did not come back: {sequencer.process.log_tail(10)}")
                time.sleep(0.05)
            release[f"s{sequencer_id}"] = to
            say(f"sequencer {sequencer_id} ({'active' if was_active else 'standby'}) -> {to} in "
                f"{time.monotonic() - began_s:.1f} s{took_over}")

        def standby_first() -> list[int]:
            active = cluster.wait_for_active_sequencer()
            return sorted(cluster.sequencers, key=lambda s: s == active)

        time.sleep(SETTLE_S)
        check_state("all old")
        for node_id in (1, 2, 3):
            roll(node_id, "new")
            phases.append((f"node {node_id} new", time.time()))
            time.sleep(SETTLE_S)
            check_state(f"node {node_id} new")
        for sequencer_id in standby_first():
            roll_sequencer(sequencer_id, "new")
            phases.append((f"sequencer {sequencer_id} new", time.time()))
            time.sleep(SETTLE_S)
            check_state(f"sequencer {sequencer_id} new")
        roll(3, "old")
        phases.append(("node 3 rolled back", time.time()))
        time.sleep(SETTLE_S)
        check_state("node 3 rolled back")
        # A sequencer back to the old release, and made the active one: it takes over the
        # state (epoch, reservation) the new release wrote.
        back, restarted = standby_first()
        roll_sequencer(back, "old")
        roll_sequencer(restarted, "new")
        if cluster.active_sequencer() != back:
            problems.append(f"sequencer {back} (old release) is not the active one after the rollback")
        phases.append((f"sequencer {back} rolled back", time.time()))
        time.sleep(SETTLE_S)
        check_state(f"sequencer {back} rolled back")

        for name in procs:
            (work / f"{name}.jsonl.stop").touch()
        queue_stop.set()
        writer.stop_flag.set()
        strict_writer.stop_flag.set()
        writer.join(240)
        strict_writer.join(240)
        queue_thread.join(150)
        for proc in procs.values():
            proc.wait(200)
        read_everything(bs, "log", 6, history)
        reader.stop_flag.set()
        reader.join(30)

        def phase_at(t: float) -> str:
            return ([label for label, began in phases if began <= t] or [phases[0][0]])[-1]

        acks_by_phase: collections.Counter[str] = collections.Counter()
        for e in read_lines(work / "o.jsonl"):
            if e["ev"] == "sent":
                history.sent.add(e["v"].encode())
            elif e["ev"] == "ack":
                history.acked[e["v"].encode()] = (e["p"], e["o"])
                acks_by_phase[phase_at(e["t"])] += 1
        say("old-SDK producer acks per phase", dict(acks_by_phase))
        strict_by_phase: collections.Counter[str] = collections.Counter()
        for e in read_lines(work / "os.jsonl"):
            if e["ev"] == "sent":
                strict.sent.add(e["v"].encode())
            elif e["ev"] == "ack":
                strict.acked[e["v"].encode()] = (e["p"], e["o"])
                strict_by_phase[phase_at(e["t"])] += 1
            elif e["ev"] == "fail":
                strict.failed[e["v"].encode()] = e["err"]
        say("old-SDK strict-order producer acks per phase", dict(strict_by_phase))
        for label, error in (("new-SDK strict-order producer", strict_writer.error),
                             ("new-SDK producer", writer.error)):
            if error is not None:
                problems.append(f"{label} failed: {error!r}")
        end_s = time.monotonic() + 90
        acked_strict = set(strict.acked)
        while time.monotonic() < end_s and ordered.error is None and not acked_strict <= {v for *_r, v in ordered.seen}:
            time.sleep(0.2)
        time.sleep(1.0)
        ordered.stop_flag.set()
        ordered.join(30)
        if ordered.error is not None:
            problems.append(f"live ordered reader failed: {ordered.error!r}")
        live = list(ordered.seen)
        fresh = read_ordered(bs, "ledger", len(live))
        strict_problems = check_strict(strict.acked, live, fresh, ["ns", "os"])
        strict_problems += [f"ledger acknowledged out of send order: {line}" for label in ("ns", "os")
                            for line in producer_order(strict, label)]
        say("ledger (strict order): sent", len(strict.sent), "acked", len(strict.acked), "failed", len(strict.failed),
            "read in order live", len(live), "fresh", len(fresh), "global IDs", live[0][0] if live else None, "..",
            live[-1][0] if live else None, "longest stall of the live reader",
            f"{ordered.consumer.merge.longest_stall_s:.2f} s", "problems", len(strict_problems))
        problems += strict_problems
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
        if again:
            problems.append(f"queue q: {len(again)} delivered after ack {again[:3]}")
        # A missing message whose ack was refused after it was sent may have been acked all the
        # same (LeaseNotHeldError.unknown, docs/QUEUES.md): __queue_state says, once the nodes stop.
        refused = {tuple(position) for e in events if e["ev"] == "ackerr" for position in e.get("lost", [])}
        where_q = {e["v"]: (e["p"], e["o"]) for e in events if e["ev"] == "recv"}
        received_by = {e["v"]: e["w"] for e in events if e["ev"] == "recv"}  # the last to receive it
        collect_replicas(cluster, "log", 6, history)
        if missing:
            candidates = {where_q[v] for v in missing if v in where_q and where_q[v] in refused}
            states = queue_states(Path(cluster.nodes[1].data_dir), "q", "qg", candidates)
            settled = {v for v in missing if v in where_q and states.get(where_q[v]) == "acked"}
            say("queue q: missing", sorted(missing), "of which ack refused yet acked in __queue_state", sorted(settled),
                "(each refused ack:", [(e["w"], e["err"][:120]) for e in events if e["ev"] == "ackerr"], ")")
            # This tree's SDK must have said so: in LeaseNotHeldError.unknown.
            told = {tuple(position) for e in events if e["ev"] == "ackerr" and e["w"] == "neww"
                    for position in e.get("unknown", [])}
            untold = sorted(v for v in settled if received_by.get(v) == "neww" and where_q[v] not in told)
            if untold:
                problems.append(f"queue q: new SDK refused acks that held without listing them in 'unknown': {untold[:3]}")
            if missing - settled:
                problems.append(f"queue q: {len(missing - settled)} missing {sorted(missing - settled)[:3]}")
        collect_replicas(cluster, "ledger", STRICT_PARTITIONS, strict)  # nodes already stopped: reads only
        problems += [f"ledger replicas: {line}" for line in divergence(strict.replicas)]
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

"""Queue mode under faults: 8 competing workers acking after processing, 100,000 messages,
workers SIGKILLed, the queue partitions' leader SIGKILLed, and one SIGSTOPped past its
ZooKeeper session and woken (its successor then SIGKILLed) during the run.

Seeded (FABRIC_FAULT_SEED reproduces a run). The checker reads the producer's
acknowledgements and every worker's log (tests/fault/queue_worker.py):

* lost: a message the producer had acknowledged that no worker acked or tried to ack, and
  (for a poison message) that is not in the dead-letter queue: must be 0;
* acked then redelivered: a message received by anyone after a worker's ack of it
  returned: must be 0;
* every redelivery of a good message follows a delivery whose lease was live at a crash
  (the worker was SIGKILLed while holding it, or a leader was killed while it was leased)
  or that the worker could not ack because the lease had ended: counted and printed;
* the dead-letter queue holds exactly the poison messages.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, QueueConsumer, TopicPartition
from tests.fault.harness import keep_logs, seed_from_env, wait_until

pytestmark = pytest.mark.slow

MESSAGES = 100_000
POISON = 20
WORKERS = 8
PARTITIONS = 4
# Short enough that a killed worker's messages come back within the run, long enough that a
# live worker on this shared 2-core machine acks in time (at 3 s, a heavily loaded run saw
# live workers' leases end and good messages reach max_deliveries: correct behaviour, but
# not what this test is about). MAX_DELIVERIES is the default.
VISIBILITY_MS = 10_000
LEADER_KILL_GRACE_S = 0.5  # a reply the killed leader sent just before dying is logged this much later at most;
# the next leader is not serving for seconds after a kill, so no lease of its falls in the window
MAX_DELIVERIES = 5
PAUSED_PAST_SESSION_S = 1.5  # a paused leader stays stopped this long after its session could expire
RUN_TIMEOUT_S = 300.0


class Worker:
    def __init__(self, name: str, bootstrap: str, queue: str, log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.jsonl"
        self.stderr = open(log_dir / f"{name}.stderr", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([sys.executable, "-m", "tests.fault.queue_worker", bootstrap, queue, name,
                                         str(self.log_path)], stdout=subprocess.DEVNULL, stderr=self.stderr)
        self.killed_at: float | None = None  # wall clock, as the worker logs

    def kill(self) -> None:
        self.killed_at = time.time()
        self.process.kill()
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.stderr.close()

    def events(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # the line a SIGKILL cut
        return out


def test_queue_survives_worker_and_leader_kills(fresh_cluster: LocalCluster, tmp_path: Path) -> None:
    seed = seed_from_env()
    print(f"\nreproduce this run with FABRIC_FAULT_SEED={seed}")
    rng = random.Random(seed)
    bootstrap = fresh_cluster.bootstrap
    queue, dlq = "jobs", "jobs.dlq"
    with Admin(bootstrap) as admin:
        # A short dedup window lets the leaders delete consumed batches while the faults
        # happen (docs/QUEUES.md): a deletion too early would show here as a lost message.
        admin.create_queue(queue, PARTITIONS, visibility_timeout_ms=VISIBILITY_MS, max_deliveries=MAX_DELIVERIES,
                           dead_letter=dlq, dedup_window_ms=200)
    poison_ids = set(rng.sample(range(MESSAGES), POISON))
    values = [(f"poison-{i}" if i in poison_ids else f"m-{i}") for i in range(MESSAGES)]
    workers: list[Worker] = []
    names = iter(f"w{i}" for i in range(100))
    leader_kills: list[float] = []

    def add() -> None:
        workers.append(Worker(next(names), bootstrap, queue, tmp_path))

    try:
        for _ in range(WORKERS):
            add()
        produced: set[str] = set()
        produce_start = time.monotonic()
        with Producer(bootstrap, linger_ms=5) as producer:
            futures = [(v, producer.send(queue, v.encode())) for v in values]
            actions = ["kill-worker", "kill-worker", "kill-leader", "kill-worker", "pause-leader"]
            rng.shuffle(actions)
            for v, f in futures:
                f.result(timeout=120)
                produced.add(v)
        start = time.monotonic()
        print(f"produced {MESSAGES} in {start - produce_start:.1f} s while the workers consumed")
        for action in actions:
            time.sleep(rng.uniform(1.0, 3.0))
            if action == "kill-worker":
                live = [w for w in workers if w.process.poll() is None]
                rng.choice(live).kill()
                add()  # a replacement, as a supervisor would start
            elif action == "pause-leader":
                # Past its session: a successor serves, then the paused one wakes (with a state
                # write's reply waiting) and that successor dies too, so a third leader reloads
                # what __queue_state says. A deposed leader's write landing after its
                # successor's once took acknowledged messages back to leases there.
                partition = rng.randrange(PARTITIONS)
                with Admin(bootstrap) as admin:
                    paused = admin.describe_topic(queue).partitions[partition].leader
                fresh_cluster.nodes[paused].pause()
                time.sleep(fresh_cluster.session_timeout_ms / 1000.0 + PAUSED_PAST_SESSION_S)
                fresh_cluster.nodes[paused].resume()
                leader_kills.append(time.time())  # its leases ended with its session
                time.sleep(rng.uniform(1.5, 3.0))
                with Admin(bootstrap) as admin:
                    successor = admin.describe_topic(queue).partitions[partition].leader
                if successor not in (paused, -1):
                    fresh_cluster.nodes[successor].kill()
                    leader_kills.append(time.time())
                    time.sleep(1.0)
                    fresh_cluster.nodes[successor].start()
            else:
                with Admin(bootstrap) as admin:
                    leader = admin.describe_topic(queue).partitions[rng.randrange(PARTITIONS)].leader
                fresh_cluster.nodes[leader].kill()
                # Stamped once the process is gone: a lease it granted in its last milliseconds
                # (its ack then stuck on the dead leader) is one the kill explains. Stamped
                # before kill(), such leases were reported unexplained (150 in one CI run).
                leader_kills.append(time.time())
                time.sleep(1.0)
                fresh_cluster.nodes[leader].start()  # back as a follower; it catches up

        def all_done() -> bool:
            with Admin(bootstrap) as admin:
                desc = admin.describe_queue(queue, "workers")
            waiting = desc.total("visible") + desc.total("in_flight") + desc.total("delayed")
            return waiting == 0 and desc.total("dead_lettered") >= POISON

        wait_until(all_done, "every message acked or dead-lettered", timeout_s=RUN_TIMEOUT_S, interval_s=1.0)
        elapsed = time.monotonic() - start
        partitions = [TopicPartition(queue, p) for p in range(PARTITIONS)]

        def all_deleted() -> bool:
            with Consumer(bootstrap) as consumer:
                return consumer.beginning_offsets(partitions) == consumer.end_offsets(partitions)

        wait_until(all_deleted, "every consumed batch deleted", timeout_s=60.0, interval_s=0.5)
        for w in workers:
            w.stop()
        with QueueConsumer(bootstrap, dlq, "checker") as reader:
            dead: list[str] = []
            while True:
                batch = reader.receive(1000, 1500)
                if not batch:
                    break
                dead.extend((m.value or b"").decode() for m in batch)
                reader.ack(batch)
        report = _check(workers, produced, {values[i] for i in poison_ids}, dead, leader_kills)
        print(f"\n{MESSAGES} messages, {WORKERS} workers, {elapsed:.1f} s after the producer finished; "
              f"killed {sum(w.killed_at is not None for w in workers)} workers and {len(leader_kills)} leaders")
        for key, value in report.items():
            print(f"  {key}: {value if not isinstance(value, list) else len(value)}")
        assert report["lost"] == [], report["lost"][:10]
        assert report["acked_then_redelivered"] == [], report["acked_then_redelivered"][:10]
        assert report["unexplained_redeliveries"] == [], report["unexplained_redeliveries"][:10]
        assert report["dlq_wrong"] == [], report["dlq_wrong"][:10]
    except BaseException:
        keep_logs(fresh_cluster, "test_queue_fault")
        raise
    finally:
        for w in workers:
            w.stop()


def _check(workers: list[Worker], produced: set[str], poison: set[str], dead: list[str],
           leader_kills: list[float]) -> dict[str, Any]:
    recvs: dict[str, list[tuple[float, Worker]]] = defaultdict(list)
    acked_at: dict[str, float] = {}
    tried: set[str] = set()
    ack_refused: set[tuple[str, str]] = set()  # (value, worker) whose ack came back "lease ended"
    for w in workers:
        for e in w.events():
            for value, _p, _o, _count in e.get("ids", []):
                if e["ev"] == "recv":
                    recvs[value].append((e["t"], w))
                elif e["ev"] in ("acking", "acked"):
                    tried.add(value)
                    if e["ev"] == "acked":
                        acked_at[value] = min(acked_at.get(value, e["t"]), e["t"])
                elif e["ev"] in ("ack_lost", "nack_lost"):
                    ack_refused.add((value, w.name))
    good = produced - poison
    lost = sorted(v for v in good if v not in tried) + sorted(v for v in poison if v not in set(dead))
    acked_then_redelivered = sorted(v for v, t in acked_at.items() if any(rt > t for rt, _w in recvs.get(v, [])))
    redeliveries: dict[str, int] = defaultdict(int)
    unexplained = []
    for value in good:
        deliveries = sorted(recvs.get(value, []), key=lambda x: x[0])
        for (t_prev, w_prev), (_t_next, _w_next) in itertools.pairwise(deliveries):
            if w_prev.killed_at is not None and w_prev.killed_at >= t_prev:
                redeliveries["worker killed holding it"] += 1
            elif any(k + LEADER_KILL_GRACE_S >= t_prev for k in leader_kills):
                redeliveries["leader killed while leased"] += 1
            elif (value, w_prev.name) in ack_refused:
                redeliveries["ack refused, lease had ended (timeout, or a state reload after a kill)"] += 1
            else:
                unexplained.append(value)
    dlq_wrong = sorted(set(dead) ^ poison)
    return {"lost": lost, "acked_then_redelivered": acked_then_redelivered, "redeliveries": dict(redeliveries),
            "unexplained_redeliveries": unexplained, "dlq_wrong": dlq_wrong,
            "dlq_duplicates": len(dead) - len(set(dead))}

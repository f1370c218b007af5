"""Consumer-group rebalancing: join-to-first-record time, and whether the other members stop.

    python -m bench.groups [--rounds 5] [--heartbeat-ms 3000] [--rate 1200]

Three nodes, one topic of 6 partitions, a producer writing ``--rate`` records/s round
robin. Two members read (each in its own thread, as two processes would). Each round a
third member joins, reads for a while, and leaves with ``close()``. We measure:

* ``join_to_first_record_ms``: from ``subscribe()`` of the new member to its first record.
  Cooperative assignment bounds it by the other members' next heartbeat (they learn of
  the join then, revoke, confirm at once) plus the new member's next heartbeat (it is
  told to come back after 100 ms while it waits).
* ``stall_ms``: for the partitions the old members keep through the rebalance, the
  longest gap between records they received during the rebalance (join to first record,
  plus half a second each side), and the same measure over the two seconds before the
  join as the baseline. The goal is equal figures: nobody stops for a rebalance.
* the same two gaps around the leave.

Figures are medians over rounds (and maxima), printed, then one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._cli import json_line, positive_float, positive_int, run
from bench.stats import median
from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition

PARTITIONS = 6
SESSION_TIMEOUT_MS = 10_000
WINDOW_PAD_S = 0.5
BASELINE_S = 2.0


class Member(threading.Thread):
    def __init__(self, name: str, bootstrap: str, topic: str, group: str, heartbeat_ms: int) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer = Consumer(bootstrap, group_id=group, session_timeout_ms=SESSION_TIMEOUT_MS,
                                 heartbeat_interval_ms=heartbeat_ms, auto_offset_reset="latest")
        self.topic = topic
        self.arrivals: dict[int, list[float]] = {}
        self.first_record_s: float | None = None
        self.subscribed_s = 0.0
        self.stop_event = threading.Event()
        self.owned_log: list[tuple[float, frozenset[TopicPartition]]] = []

    def run(self) -> None:
        self.subscribed_s = time.monotonic()
        self.consumer.subscribe([self.topic])
        while not self.stop_event.is_set():
            records = self.consumer.poll(timeout_ms=20)
            now = time.monotonic()
            if records and self.first_record_s is None:
                self.first_record_s = now
            for r in records:
                self.arrivals.setdefault(r.partition, []).append(now)
            owned = frozenset(self.consumer.assignment())
            if not self.owned_log or self.owned_log[-1][1] != owned:
                self.owned_log.append((now, owned))
        self.consumer.close()

    def owned_at(self, t: float) -> frozenset[TopicPartition]:
        current: frozenset[TopicPartition] = frozenset()
        for when, owned in self.owned_log:
            if when > t:
                break
            current = owned
        return current


def max_gap_ms(times: list[float], start: float, end: float) -> float:
    inside = [t for t in times if start <= t <= end]
    points = [start, *inside, end]
    return max(b - a for a, b in itertools.pairwise(points)) * 1000.0


def kept_gaps(members: list[Member], start: float, end: float) -> list[float]:
    """Longest arrival gap, per partition an old member owned at both ends of the window."""
    gaps = []
    for m in members:
        kept = m.owned_at(start) & m.owned_at(end)
        for tp in kept:
            gaps.append(max_gap_ms(m.arrivals.get(tp.partition, []), start, end))
    return gaps


def produce_forever(bootstrap: str, topic: str, rate: int, stop: threading.Event) -> None:
    with Producer(bootstrap, acks=1, linger_ms=2) as producer:
        i = 0
        started = time.monotonic()
        while not stop.is_set():
            producer.send(topic, b"x" * 100, partition=i % PARTITIONS)
            i += 1
            ahead = i / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.groups", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--heartbeat-ms", type=positive_int, default=3_000)
    parser.add_argument("--rate", type=positive_int, default=1_200, help="records per second, all partitions")
    parser.add_argument("--hold-s", type=positive_float, default=5.0, help="how long the third member stays each round")
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {k: [] for k in (
        "join_to_first_record_ms", "join_stall_ms", "join_baseline_gap_ms", "leave_stall_ms", "leave_baseline_gap_ms")}
    with tempfile.TemporaryDirectory(prefix="fabric-bench-groups-") as tmp, \
            LocalCluster(3, Path(tmp) / "cluster") as cluster:
        bootstrap = cluster.bootstrap
        topic, group = "bench-groups", "bench-group"
        with Admin(bootstrap) as admin:
            admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
        stop = threading.Event()
        producer = threading.Thread(target=produce_forever, args=(bootstrap, topic, args.rate, stop), daemon=True)
        producer.start()
        old = [Member(f"m{i}", bootstrap, topic, group, args.heartbeat_ms) for i in range(2)]
        for m in old:
            m.start()
        time.sleep(5.0)  # settle: both old members own three partitions and read
        try:
            for round_no in range(args.rounds):
                joiner = Member(f"j{round_no}", bootstrap, topic, group, args.heartbeat_ms)
                joined = time.monotonic()
                joiner.start()
                while joiner.first_record_s is None and time.monotonic() - joined < 30:
                    time.sleep(0.01)
                first = joiner.first_record_s or float("nan")
                time.sleep(args.hold_s)
                results["join_to_first_record_ms"].append((first - joiner.subscribed_s) * 1000.0)
                results["join_stall_ms"].append(max(kept_gaps(old, joined - WINDOW_PAD_S, first + WINDOW_PAD_S)))
                results["join_baseline_gap_ms"].append(max(kept_gaps(old, joined - BASELINE_S, joined)))
                left = time.monotonic()
                joiner.stop_event.set()
                joiner.join(30)
                time.sleep(args.hold_s)
                # The leave ends when the old members own all six partitions again.
                settled = min((t for m in old for t, _o in m.owned_log if t > left), default=left)
                settled = max(settled, max((t for m in old for t, _o in m.owned_log), default=left))
                results["leave_stall_ms"].append(max(kept_gaps(old, left - WINDOW_PAD_S, settled + WINDOW_PAD_S)))
                results["leave_baseline_gap_ms"].append(max(kept_gaps(old, left - BASELINE_S, left)))
                print(f"round {round_no + 1}: join->first record {results['join_to_first_record_ms'][-1]:.0f} ms; "
                      f"old members' longest gap during join {results['join_stall_ms'][-1]:.0f} ms "
                      f"(before: {results['join_baseline_gap_ms'][-1]:.0f} ms), during leave "
                      f"{results['leave_stall_ms'][-1]:.0f} ms (before: {results['leave_baseline_gap_ms'][-1]:.0f} ms)",
                      flush=True)
        finally:
            for m in old:
                m.stop_event.set()
            for m in old:
                m.join(30)
            stop.set()
            producer.join(30)
    summary: dict[str, Any] = {"bench": "groups", "rounds": args.rounds, "heartbeat_interval_ms": args.heartbeat_ms,
                               "rate_msgs_per_s": args.rate}
    for key, values in results.items():
        summary[f"{key}_median"] = round(median(values), 1)
        summary[f"{key}_max"] = round(max(values), 1)
    print(json_line(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    run(main)

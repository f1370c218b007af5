"""Node CPU per message: the storage nodes' own CPU time for a fixed replicated workload.

Three nodes, one topic of 4 partitions at replication factor 3, acks=all, 16 KB batches;
the figure is the nodes' user + system CPU seconds (from /proc, summed over the three
processes) per message produced. CPU time moves far less than wall time when other work
shares the machine, so two trees (say, before and after a change to ``nodes/``) can be
compared on a busy host: run each a few times, interleaved, and compare the medians.

    python3 -m bench.node_cpu --messages 200000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench._cli import json_line, positive_int, run
from bench.stats import median
from fabric.local import LocalCluster
from sdk import Admin, Producer

PARTITIONS = 4
BATCH_BYTES_MAX = 16 * 1024
VALUE_BYTES = 100
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def run_once(cluster: LocalCluster, topic: str, n: int) -> tuple[float, float]:
    """(node CPU microseconds per message, produce wall seconds) for one run."""
    pids = [node.process.proc.pid for node in cluster.nodes.values() if node.process.proc is not None]
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    value = b"x" * VALUE_BYTES
    with Producer(cluster.bootstrap, acks="all", linger_ms=1, batch_bytes_max=BATCH_BYTES_MAX) as producer:
        producer.send(topic, b"warm-up").result(30)
        cpu_before_s = sum(process_cpu_s(p) for p in pids)
        started = time.perf_counter()
        for _ in range(n):
            producer.send(topic, value)
        producer.flush(timeout=600)
        wall_s = time.perf_counter() - started
    time.sleep(0.5)  # followers finish applying the tail
    cpu_s = sum(process_cpu_s(p) for p in pids) - cpu_before_s
    return cpu_s / n * 1e6, wall_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_cpu", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=200_000)
    parser.add_argument("--repeats", type=positive_int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fabric-bench-") as tmp, LocalCluster(3, Path(tmp) / "cluster") as cluster:
        runs = [run_once(cluster, f"node-cpu-{r}", args.messages) for r in range(args.repeats)]
    cpu_us = [c for c, _ in runs]
    print(f"3 nodes, rf=3, acks=all, {args.messages:,} messages of {VALUE_BYTES} B per run: node CPU "
          f"{median(cpu_us):.2f} us/msg (median; runs {[round(c, 2) for c in cpu_us]}), "
          f"produce wall {median([w for _, w in runs]):.2f} s")
    print(json_line({"bench": "node_cpu", "messages": args.messages, "repeats": args.repeats,
                      "node_cpu_us_per_msg_median": round(median(cpu_us), 2),
                      "node_cpu_us_per_msg_runs": [round(c, 2) for c in cpu_us]}))
    return 0


if __name__ == "__main__":
    run(main)

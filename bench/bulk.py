"""Bulk produce (``Producer.send_batch``) into RF 3, acks=all, idempotent, against the raw
baseline in the same run.

    python -m bench.bulk [--messages 3000000] [--repeats 3] [--size 100] [--chunk 100000]

Three local nodes, one topic of 6 partitions, RF 3, acks=all, lz4, max_in_flight 5.
The producer is handed the values as columns, ``--chunk`` records per call: a Python list
of bytes, and the same values as an Arrow binary array. Baseline: ``bench.throughput``'s
raw path (the same encoder's batches through a bare PUSH/PULL pair into bare rocksdict
puts, one process, no replication). Figures are medians over ``--repeats``; each run's
time is from the first call to the last acknowledgement.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._cli import json_line, positive_int, run
from bench.stats import median
from bench.throughput import run_baseline
from fabric.local import LocalCluster
from sdk import Admin, Producer

PARTITIONS = 6


def run_bulk(bootstrap: str, topic: str, n: int, size: int, chunk: int, arrow: bool) -> float:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    raw = os.urandom(size // 2).hex().encode()[:size]
    values: Any = [raw] * chunk
    if arrow:
        import pyarrow as pa

        values = pa.array(values, pa.binary())
    with Producer(bootstrap, acks="all", linger_ms=5, compression="lz4") as producer:
        producer.send(topic, b"warm-up").result(30)
        started = time.perf_counter()
        futures = []
        for start in range(0, n, chunk):
            part = values if start + chunk <= n else values[: n - start]
            futures.append(producer.send_batch(topic, part))
        producer.flush(timeout=600)
        elapsed = time.perf_counter() - started
        for future in futures:
            future.result(0)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=3_000_000)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--size", type=positive_int, default=100)
    parser.add_argument("--chunk", type=positive_int, default=100_000)
    args = parser.parse_args(argv)
    n, size = args.messages, args.size
    figures: dict[str, Any] = {"bench": "bulk", "messages": n, "size": size, "repeats": args.repeats,
                               "partitions": PARTITIONS, "nodes": 3, "rf": 3, "acks": "all", "chunk": args.chunk}
    with tempfile.TemporaryDirectory(prefix="fabric-bench-") as tmp, LocalCluster(3, Path(tmp) / "cluster") as cluster:
        print(f"3 nodes, {PARTITIONS} partitions, RF 3, acks=all, idempotent, lz4; {n:,} x {size} B per run, "
              f"{args.chunk:,} per send_batch call, {args.repeats} runs each; load {os.getloadavg()[0]:.1f}")
        runs: dict[str, list[float]] = {"list": [], "arrow": [], "baseline": []}
        for r in range(args.repeats):  # interleaved, so load changes hit every variant alike
            runs["list"].append(run_bulk(cluster.bootstrap, f"bulk-list-{r}", n, size, args.chunk, arrow=False))
            runs["arrow"].append(run_bulk(cluster.bootstrap, f"bulk-arrow-{r}", n, size, args.chunk, arrow=True))
            workdir = Path(tmp) / f"base-{r}"
            workdir.mkdir()
            runs["baseline"].append(run_baseline(n, size, workdir)[0])
        base = n / median(runs["baseline"])
        for name in ("list", "arrow"):
            rate = n / median(runs[name])
            figures[f"send_batch_{name}_msgs_per_s"] = round(rate)
            figures[f"send_batch_{name}_mb_per_s"] = round(rate * size / 1e6, 1)
            figures[f"send_batch_{name}_ratio_to_baseline"] = round(rate / base, 3)
            print(f"send_batch ({name:>5}): {rate:>11,.0f} msg/s {rate * size / 1e6:7.1f} MB/s  "
                  f"ratio to baseline {rate / base:.2f}   runs {[round(t, 2) for t in runs[name]]} s")
        figures["baseline_msgs_per_s"] = round(base)
        print(f"baseline          : {base:>11,.0f} msg/s   runs {[round(t, 2) for t in runs['baseline']]} s")
        figures["producer_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        figures["load_average_1m"] = round(os.getloadavg()[0], 2)
    print(json_line(figures))
    return 0


if __name__ == "__main__":
    run(main)

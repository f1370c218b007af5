"""Produce-then-consume throughput on one local node, against a raw baseline in the same run.

    python -m bench [--messages 1000000] [--repeats 3] [--sizes 100,1024]

Fabric: one Producer (acks=1, lz4, linger 5 ms) sends N messages to a topic on a single
node, then one Consumer reads them back with poll_batches(). Baseline: the same records
encoded into the same batches by the same encoder, pushed through a bare pyzmq PUSH/PULL
pair into bare rocksdict puts in another process, then read back and decoded there. The
ratio Fabric/baseline says what the protocol, acknowledgements, futures and the node
cost on top of moving and storing the bytes. Figures are medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from bench._cli import json_line, positive_int, quiet_children, read_stalled, run
from bench.stats import median
from fabric.limits import MESSAGE_BYTES_MAX_DEFAULT
from fabric.local import LocalCluster, free_port
from fabric.protocol import batch as batch_format
from sdk import Admin, Consumer, Producer, TopicPartition

BATCH_BYTES_MAX = 256 * 1024
PARTITIONS = 4


def run_fabric(bootstrap: str, topic: str, n: int, size: int, profile: bool) -> tuple[float, float]:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, replication_factor=1)
    value = os.urandom(size // 2).hex().encode()[:size]
    profiler = cProfile.Profile() if profile else None
    with Producer(bootstrap, acks=1, linger_ms=5, compression="lz4", batch_bytes_max=BATCH_BYTES_MAX) as producer:
        producer.send(topic, b"warm-up").result(30)
        if profiler:
            profiler.enable()
        started = time.perf_counter()
        send = producer.send
        try:
            for _ in range(n):
                send(topic, value)
            producer.flush(timeout=300)
        except KeyboardInterrupt:
            # Ctrl-C stops the run: leaving the with-block flushed the buffer first (up to
            # 64 MiB of records, up to close()'s 30 s on a loaded machine) before stopping.
            producer.close(0)
            raise
        produce_s = time.perf_counter() - started
        if profiler:
            profiler.disable()
            print("-- producer profile (top 12 by own time):")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    with Consumer(bootstrap) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        count = 0
        started = last = time.perf_counter()
        while read_stalled(count, n + 1, last):
            for batch in consumer.poll_batches(timeout_ms=5_000):
                count += len(batch)
                last = time.perf_counter()
        consume_s = time.perf_counter() - started
    return produce_s, consume_s


def run_baseline(n: int, size: int, workdir: Path) -> tuple[float, float]:
    """Same batches through PUSH/PULL into rocksdict.put, then read back and decoded."""
    data = f"tcp://127.0.0.1:{free_port()}"
    control_port = free_port()
    ctx: zmq.Context[Any] = zmq.Context.instance()
    control = ctx.socket(zmq.PULL)
    control.bind(f"tcp://127.0.0.1:{control_port}")
    with quiet_children():
        sink = subprocess.Popen([sys.executable, "-m", "bench.baseline_sink", "--data", data,
                                 "--control", f"tcp://127.0.0.1:{control_port}", "--db", str(workdir / "baseline-db")])
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 1000)
    try:
        # The clock starts once the sink is up and connected, as the Fabric run's starts
        # after a warm-up send: timing the sink's interpreter start-up and imports, and
        # a connect retried after ZeroMQ's 100 ms reconnect interval (the sink was not
        # listening yet), made the baseline look slow, the more so the fewer the messages.
        if not control.poll(60_000) or control.recv_string() != "ready":
            raise RuntimeError("baseline sink did not start within 60 s")
        push.connect(data)
        push.send(b"")  # an empty run: answered once the data path is up
        if not control.poll(60_000) or not control.recv_string().startswith("0 "):
            raise RuntimeError("baseline sink did not answer within 60 s")
        value = os.urandom(size // 2).hex().encode()[:size]
        per_batch = BATCH_BYTES_MAX // (size + 14)
        started = time.perf_counter()
        values: list[bytes] = []
        timestamps: list[int] = []
        for _ in range(n):
            values.append(value)
            timestamps.append(int(time.time() * 1000))
            if len(values) == per_batch:
                push.send(batch_format.encode_batch(timestamps, [None] * len(values), values), copy=False)
                values, timestamps = [], []
        if values:
            push.send(batch_format.encode_batch(timestamps, [None] * len(values), values), copy=False)
        push.send(b"")
        written = control.recv_string().split()
        produce_s = time.perf_counter() - started
        if int(written[0]) != n:
            raise RuntimeError(f"baseline sink wrote {written[0]} records, expected {n}")
        push.send(b"read")
        read = control.recv_string().split()
        if int(read[0]) != n:
            raise RuntimeError(f"baseline sink read {read[0]} records, expected {n}")
        consume_s = float(read[1])
        push.send(b"exit")
        sink.wait(60)
    finally:
        if sink.poll() is None:
            sink.kill()
        push.close(linger=0)
        control.close(linger=0)
    return produce_s, consume_s


def main(argv: list[str] | None = None, prog: str = "python -m bench") -> int:
    """``prog``: how errors and --help name the command (``fabric bench`` passes its own)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=1_000_000, help="messages per run")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs per size (the median is reported)")
    parser.add_argument("--sizes", default="100,1024", help="message sizes in bytes, comma-separated")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the producing thread (first run)")
    args = parser.parse_args(argv)
    n = args.messages
    # Checked before the cluster starts: a bad value used to end in a traceback from the
    # middle of a run (int('abc'), or the median of no runs).
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"argument --sizes: {args.sizes!r} is not byte counts like 100,1024")
    if not all(1 <= size <= MESSAGE_BYTES_MAX_DEFAULT for size in sizes):
        parser.error(f"argument --sizes: each size must be 1 to {MESSAGE_BYTES_MAX_DEFAULT:,} bytes "
                     "(a topic's default message_bytes_max)")
    figures: dict[str, Any] = {"bench": "throughput", "messages": n, "repeats": args.repeats,
                               "partitions": PARTITIONS, "nodes": 1, "acks": 1, "compression": "lz4"}
    with tempfile.TemporaryDirectory(prefix="fabric-bench-") as tmp, LocalCluster(1, Path(tmp) / "cluster") as cluster:
        print(f"one node, {PARTITIONS} partitions, acks=1, lz4, {n:,} messages per run, {args.repeats} runs each")
        for size in sizes:
            fabric_runs = [run_fabric(cluster.bootstrap, f"bench-{size}-{r}", n, size, args.profile and r == 0)
                           for r in range(args.repeats)]
            base_runs = []
            for r in range(args.repeats):
                workdir = Path(tmp) / f"base-{size}-{r}"
                workdir.mkdir()
                base_runs.append(run_baseline(n, size, workdir))
            produce = n / median([p for p, _ in fabric_runs])
            consume = n / median([c for _, c in fabric_runs])
            base_produce = n / median([p for p, _ in base_runs])
            base_consume = n / median([c for _, c in base_runs])
            mb = size / 1e6
            row = {
                f"produce_{size}b_msgs_per_s": round(produce),
                f"produce_{size}b_mb_per_s": round(produce * mb, 1),
                f"consume_{size}b_msgs_per_s": round(consume),
                f"consume_{size}b_mb_per_s": round(consume * mb, 1),
                f"baseline_produce_{size}b_msgs_per_s": round(base_produce),
                f"baseline_consume_{size}b_msgs_per_s": round(base_consume),
                f"produce_{size}b_ratio_to_baseline": round(produce / base_produce, 3),
                f"consume_{size}b_ratio_to_baseline": round(consume / base_consume, 3),
            }
            figures.update(row)
            print(f"{size:>5} B  produce {produce:>11,.0f} msg/s {produce * mb:7.1f} MB/s   "
                  f"consume {consume:>11,.0f} msg/s {consume * mb:7.1f} MB/s")
            print(f"{'':>5}    baseline produce {base_produce:>11,.0f} msg/s   consume {base_consume:>11,.0f} msg/s   "
                  f"ratio produce {produce / base_produce:.2f}  consume {consume / base_consume:.2f}")
            print(f"{'':>5}    runs (produce s, consume s): fabric {[(round(p, 2), round(c, 2)) for p, c in fabric_runs]} "
                  f"baseline {[(round(p, 2), round(c, 2)) for p, c in base_runs]}")
    print(json_line(figures))
    return 0


if __name__ == "__main__":
    run(main)

"""C producer versus Python producer against the same local node.

    python -m bench.c_client [--messages 1000000] [--value-bytes 100] [--repeat 3]

Starts a single-node LocalCluster (real ZooKeeper, real node process), builds sdk/c, then
for each repeat produces ``--messages`` records of ``--value-bytes`` bytes with
``fabric-produce`` (stdin lines) and with ``sdk.Producer`` (in this process), each to a
fresh topic, acks=1, lz4, default linger and batch size on both. Reports msgs/s and MB/s
(value bytes), medians over the repeats, the C/Python ratio, and who was busy: the
producer's CPU time and the node's CPU time (from /proc) as a share of wall time. A
share near 1.0 means that process saturated one core and limited the run.

Measures and reports only; nothing here is asserted. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import string
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._cli import json_line, positive_int, run
from fabric.local import LocalCluster
from sdk import Admin, Producer

REPO = Path(__file__).resolve().parents[1]
SDK_C = REPO / "sdk" / "c"
PARTITIONS = 1
PROCESS_TIMEOUT_S = 600.0
SATURATED_SHARE = 0.85  # CPU time / wall time above which a process limited the run
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def make_values(count: int, size: int, seed: int = 7) -> list[bytes]:
    """Distinct printable values (no tab or newline), lightly compressible like real text."""
    rng = random.Random(seed)
    alphabet = (string.ascii_letters + string.digits).encode()
    pool = bytes(rng.choice(alphabet) for _ in range(size * 64))
    out = []
    for i in range(count):
        start = (i * 37) % (len(pool) - size)
        prefix = b"%09d|" % i
        out.append((prefix + pool[start : start + size])[:size])
    return out


def build_c_client() -> Path:
    subprocess.run(["make", "-C", str(SDK_C), "-j2", "fabric-produce"], check=True,
                   stdout=subprocess.DEVNULL, timeout=PROCESS_TIMEOUT_S)
    return SDK_C / "fabric-produce"


def run_c(binary: Path, addresses: str, topic: str, input_path: Path, node_pid: int) -> dict[str, float]:
    node_cpu0 = process_cpu_s(node_pid)
    start = time.perf_counter()
    with open(input_path, "rb") as stdin:
        proc = subprocess.Popen([str(binary), "-b", addresses, "-t", topic, "-a", "1", "-z", "lz4", "-q"],
                                stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    node_cpu = process_cpu_s(node_pid) - node_cpu0
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"fabric-produce failed ({proc.returncode}): {stderr}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "node_cpu_s": node_cpu}


def run_python(bootstrap: str, topic: str, values: list[bytes], node_pid: int) -> dict[str, float]:
    producer = Producer(bootstrap, acks=1, compression="lz4")
    try:
        producer.partitions_for(topic)  # metadata first, as fabric-produce does
        node_cpu0 = process_cpu_s(node_pid)
        cpu0 = time.process_time()
        start = time.perf_counter()
        for value in values:
            producer.send(topic, value)
        producer.flush()
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        node_cpu = process_cpu_s(node_pid) - node_cpu0
    finally:
        producer.close()
    return {"wall_s": wall, "cpu_s": cpu, "node_cpu_s": node_cpu}


def summarize(runs: list[dict[str, float]], messages: int, value_bytes: int) -> dict[str, float]:
    wall = statistics.median(r["wall_s"] for r in runs)
    return {
        "msgs_per_s": round(messages / wall),
        "mb_per_s": round(messages * value_bytes / wall / 1e6, 2),
        "wall_s_median": round(wall, 3),
        "producer_cpu_share": round(statistics.median(r["cpu_s"] / r["wall_s"] for r in runs), 2),
        "node_cpu_share": round(statistics.median(r["node_cpu_s"] / r["wall_s"] for r in runs), 2),
    }


def limiter(stats: dict[str, float]) -> str:
    if stats["node_cpu_share"] >= SATURATED_SHARE:
        return "node"
    if stats["producer_cpu_share"] >= SATURATED_SHARE:
        return "producer"
    # One batch per partition in flight (for ordering): the producer waits for each ack.
    return "round trips (neither process saturated a core)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.c_client", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=1_000_000)
    parser.add_argument("--value-bytes", type=positive_int, default=100)
    parser.add_argument("--repeat", type=positive_int, default=3)
    args = parser.parse_args(argv)

    binary = build_c_client()
    values = make_values(args.messages, args.value_bytes)
    c_runs: list[dict[str, float]] = []
    py_runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="fabric-bench-c-") as tmp, LocalCluster(1, Path(tmp) / "cluster") as cluster:
        input_path = Path(tmp) / "values.txt"
        input_path.write_bytes(b"\n".join(values) + b"\n")
        with Admin(cluster.bootstrap) as admin:
            addresses = ",".join(admin.nodes().values())
        node_pid = cluster.nodes[1].process.pid
        for i in range(args.repeat):
            for lang, runs in (("c", c_runs), ("python", py_runs)):
                topic = f"bench-{lang}-{i}"
                with Admin(cluster.bootstrap) as admin:
                    admin.create_topic(topic, partitions=PARTITIONS, replication_factor=1)
                if lang == "c":
                    result = run_c(binary, addresses, topic, input_path, node_pid)
                else:
                    result = run_python(cluster.bootstrap, topic, values, node_pid)
                runs.append(result)
                print(f"run {i + 1}/{args.repeat} {lang:6s}: {args.messages / result['wall_s']:>10,.0f} msgs/s "
                      f"wall {result['wall_s']:.2f} s, producer cpu {result['cpu_s']:.2f} s, "
                      f"node cpu {result['node_cpu_s']:.2f} s", flush=True)
    c_stats = summarize(c_runs, args.messages, args.value_bytes)
    py_stats = summarize(py_runs, args.messages, args.value_bytes)
    ratio = round(c_stats["msgs_per_s"] / py_stats["msgs_per_s"], 2)
    for name, stats in (("C", c_stats), ("Python", py_stats)):
        print(f"{name:6s} producer: {stats['msgs_per_s']:>10,} msgs/s  {stats['mb_per_s']:7.2f} MB/s  "
              f"(median of {args.repeat}); producer CPU {stats['producer_cpu_share']:.0%} of wall, "
              f"node CPU {stats['node_cpu_share']:.0%} of wall; limited by: {limiter(stats)}")
    print(f"C/Python throughput ratio: {ratio}")
    summary: dict[str, Any] = {
        "bench": "c_client",
        "messages": args.messages,
        "value_bytes": args.value_bytes,
        "repeat": args.repeat,
        "c": {**c_stats, "limited_by": limiter(c_stats)},
        "python": {**py_stats, "limited_by": limiter(py_stats)},
        "c_over_python": ratio,
    }
    print(json_line(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    run(main)

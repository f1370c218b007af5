"""Growth: does throughput stay flat as data, partitions and producers grow? Printed as
ratios from one run, with the peak resident memory of the producer and of the node.

    python -m bench.growth [--messages 500000] [--retained-mb 1024] [--repeats 3] [--producers-nice 0]

One local node, acks=1, lz4, random (incompressible, so stored as they are) 100-byte
records sent with ``send_batch`` (so that the producer's Python work does not hide the
node's), and for the producers' second ratio with a ``send()`` each:

* retained: produce and consume ``--messages`` on an empty 4-partition topic, then fill
  the same topic with ``--retained-mb`` more and measure again (consume reads the newest
  ``--messages``): ratio retained / empty (the issue asks for 10 GB; the size used is
  printed, choose one that fits the time and the disk);
* partitions: aggregate produce into 64 partitions vs 1 (sticky, whole batches);
* producers: 16 producer processes at once vs 1, the same total count, twice: with
  ``send_batch`` (one producer already keeps the node's loop busy, so this asks whether
  sixteen cost the node more) and with a ``send()`` per record (the usual service: each
  producer's Python is the limit, and sixteen share both cores). Each of the 16 first
  sends its whole share once, untimed (the single producer runs in this long-lived
  process, whose memory has long been in use: a new process's first pass touches its
  buffers for the first time), and none closes or exits before all have reported, so the
  timed window holds the 16 producers' sending and nothing of their start-up or teardown.
  ``--producers-nice N`` runs the producers of this part (the single one too, and so the
  sixteen, which inherit it) at niceness N, the node at its own: on a machine the node
  shares, sixteen busy producers at equal priority take CPU the node needs, which is not
  so when they run on other machines, as deployed. The default, 0, is equal priority.

Medians over ``--repeats``; the node's peak RSS is its VmHWM from /proc.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._cli import json_line, non_negative_int, positive_int, quiet_children, read_stalled, run
from bench.stats import median
from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition

SIZE = 100
CHUNK = 50_000


def _values(count: int) -> list[bytes]:
    """Distinct random values: they do not compress, so retained bytes are bytes on disk."""
    blob = os.urandom(SIZE * count)
    return [blob[i * SIZE : (i + 1) * SIZE] for i in range(count)]


def produce(bootstrap: str, topic: str, n: int, together: Any = None, per_record: bool = False) -> float:
    """Seconds to send ``n`` records with send_batch (``per_record``: a send() each) and
    have them acknowledged. ``together`` (ready, go, results, finished), when several
    processes start at once: send the same ``n`` once untimed, say ready, wait for go;
    afterwards report and keep the producer open until finished is set."""
    chunk = _values(min(CHUNK, n))

    def send_all(producer: Producer) -> None:
        for start in range(0, n, CHUNK):
            values = chunk if start + CHUNK <= n else chunk[: n - start]
            if per_record:
                send = producer.send
                for value in values:
                    send(topic, value)
            else:
                producer.send_batch(topic, values)
        producer.flush(600)

    with Producer(bootstrap, acks=1) as producer:
        producer.send(topic, b"warm-up").result(30)
        if together is not None:
            ready, go, results, finished = together
            send_all(producer)  # this process's buffers grown and in use, as the single producer's are
            ready.put("ready")
            go.wait(300)
        started = time.perf_counter()
        send_all(producer)
        elapsed_s = time.perf_counter() - started
        if together is not None:
            results.put(elapsed_s)
            finished.wait(600)  # no teardown while others are still being timed
        return elapsed_s


def consume_newest(bootstrap: str, topic: str, partitions: int, n: int) -> float:
    """Seconds to read the newest ``n`` records of the topic with poll_batches."""
    with Consumer(bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(0, ends[tp] - n // partitions))
        want = sum(ends[tp] - consumer.position(tp) for tp in tps)
        count = 0
        started = last = time.perf_counter()
        while read_stalled(count, want, last):
            for batch in consumer.poll_batches(timeout_ms=5_000):
                count += len(batch)
                last = time.perf_counter()
        return time.perf_counter() - started


def many_producers(bootstrap: str, topic: str, n: int, count: int, per_record: bool = False) -> float:
    """Wall seconds for ``count`` producer processes to send ``n`` records between them."""
    ctx = multiprocessing.get_context("spawn")
    together = (ctx.Queue(), ctx.Event(), ctx.Queue(), ctx.Event())  # ready, go, results, finished
    ready, go, results, finished = together
    procs = [ctx.Process(target=produce, args=(bootstrap, topic, n // count, together, per_record), daemon=True)
             for _ in range(count)]
    with quiet_children():
        for proc in procs:
            proc.start()
    done = False
    try:
        for _ in procs:  # every process imported, connected and warmed up
            ready.get(timeout=300)
        started = time.perf_counter()
        go.set()
        for _ in procs:
            results.get(timeout=600)
        elapsed = time.perf_counter() - started
        done = True
        return elapsed
    finally:
        finished.set()
        for proc in procs:
            # Interrupted (Ctrl-C, a timeout), a producer may still wait for go: no
            # 30 s wait each, they are killed at once.
            proc.join(30 if done else 0)
            if proc.is_alive():
                proc.kill()
                proc.join(10)


def node_peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _niceness(text: str) -> int:
    value = non_negative_int(text)
    if value > 19:
        raise argparse.ArgumentTypeError(f"{text!r} is above 19, the highest niceness")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.growth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=500_000)
    parser.add_argument("--retained-mb", type=positive_int, default=1024)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--producers-nice", type=_niceness, default=0, metavar="0-19",
                        help="niceness of the producers of the producers part (the node keeps its own)")
    args = parser.parse_args(argv)
    n, repeats = args.messages, args.repeats
    figures: dict[str, Any] = {"bench": "growth", "messages": n, "size": SIZE, "retained_mb": args.retained_mb,
                               "repeats": repeats, "producers_nice": args.producers_nice,
                               "load_average_1m_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="fabric-bench-") as tmp, LocalCluster(1, Path(tmp) / "cluster") as cluster:
        bootstrap = cluster.bootstrap
        node_pid = next(iter(cluster.nodes.values())).process.pid
        with Admin(bootstrap) as admin:
            admin.create_topic("grow", partitions=4, replication_factor=1)
            admin.create_topic("p1", partitions=1, replication_factor=1)
            admin.create_topic("p64", partitions=64, replication_factor=1)
            admin.create_topic("many", partitions=16, replication_factor=1)
        print(f"one node, acks=1, {SIZE} B records, {n:,} per measurement, {repeats} repeats; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)

        def produce_consume() -> tuple[float, float]:
            p = [produce(bootstrap, "grow", n) for _ in range(repeats)]
            c = [consume_newest(bootstrap, "grow", 4, n) for _ in range(repeats)]
            return n / median(p), n / median(c)

        empty = produce_consume()
        fill = args.retained_mb * 1_000_000 // SIZE
        fill_s = produce(bootstrap, "grow", fill)
        retained = produce_consume()
        print(f"retained {args.retained_mb} MB ({fill:,} records, filled in {fill_s:.1f} s): produce "
              f"{retained[0]:,.0f} vs empty {empty[0]:,.0f} msg/s = {retained[0] / empty[0]:.2f}; consume "
              f"{retained[1]:,.0f} vs {empty[1]:,.0f} = {retained[1] / empty[1]:.2f}", flush=True)
        one = [n / produce(bootstrap, "p1", n) for _ in range(repeats)]
        sixty_four = [n / produce(bootstrap, "p64", n) for _ in range(repeats)]
        print(f"partitions: 64 -> {median(sixty_four):,.0f} msg/s vs 1 -> {median(one):,.0f} = "
              f"{median(sixty_four) / median(one):.2f}", flush=True)
        if args.producers_nice:
            os.nice(args.producers_nice)  # this process and the producers it starts from now on; the node started before
        single = [n / produce(bootstrap, "many", n) for _ in range(repeats)]
        shared = n // 16 * 16  # what the sixteen send between them: n // 16 each
        sixteen = [shared / many_producers(bootstrap, "many", n, 16) for _ in range(repeats)]
        nice = f" (producers at nice {args.producers_nice})" if args.producers_nice else ""
        print(f"producers, send_batch{nice}: 16 -> {median(sixteen):,.0f} msg/s aggregate vs 1 -> "
              f"{median(single):,.0f} = {median(sixteen) / median(single):.2f}", flush=True)
        single_send = [n / produce(bootstrap, "many", n, per_record=True) for _ in range(repeats)]
        sixteen_send = [shared / many_producers(bootstrap, "many", n, 16, per_record=True) for _ in range(repeats)]
        print(f"producers, send() per record{nice}: 16 -> {median(sixteen_send):,.0f} msg/s aggregate vs 1 -> "
              f"{median(single_send):,.0f} = {median(sixteen_send) / median(single_send):.2f}", flush=True)
        figures.update({
            "empty_produce_msgs_per_s": round(empty[0]), "empty_consume_msgs_per_s": round(empty[1]),
            "retained_produce_msgs_per_s": round(retained[0]), "retained_consume_msgs_per_s": round(retained[1]),
            "ratio_retained_to_empty_produce": round(retained[0] / empty[0], 3),
            "ratio_retained_to_empty_consume": round(retained[1] / empty[1], 3),
            "ratio_64_to_1_partitions": round(median(sixty_four) / median(one), 3),
            "ratio_16_to_1_producers": round(median(sixteen) / median(single), 3),
            "single_producer_msgs_per_s": round(median(single)), "sixteen_producers_msgs_per_s": round(median(sixteen)),
            "ratio_16_to_1_producers_send": round(median(sixteen_send) / median(single_send), 3),
            "single_producer_send_msgs_per_s": round(median(single_send)),
            "sixteen_producers_send_msgs_per_s": round(median(sixteen_send)),
            "producer_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "node_peak_rss_mb": round(node_peak_rss_mb(node_pid), 1),
            "load_average_1m_end": round(os.getloadavg()[0], 2),
        })
        print(f"peak RSS: producer {figures['producer_peak_rss_mb']} MB, node {figures['node_peak_rss_mb']} MB")
    print(json_line(figures))
    return 0


if __name__ == "__main__":
    run(main)

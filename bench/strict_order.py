"""Strict-order topics against normal ones, on a local cluster of 3 nodes and 2 sequencers.

    python -m bench.strict_order [--messages 200000] [--repeats 3] [--failovers 3]

1. Produce throughput, one producer, 100-byte messages, 6 partitions, RF 3, acks=all:
   a normal topic and a strict-order topic, alternating, median of ``--repeats``; the
   ratio strict / normal is from the same run.
2. End-to-end latency at 10,000 msg/s into a strict-order topic: a plain consumer and an
   ordered consumer (``sdk.OrderedConsumer``), each in its own process, read the same
   records at once; p50/p99 of each and the difference (what ordering adds).
3. Failover: kill -9 the active sequencer while a producer writes to the strict-order
   topic; time from the kill to the first acknowledgement of a write sent after it.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._cli import join_or_kill, json_line, non_negative_int, positive_int, quiet_children, run
from bench.replication import PARTITIONS, VALUE, paced, throughput
from bench.stats import ended, latency_summary_ms, median
from fabric.local import LocalCluster
from sdk import Admin, Consumer, OrderedConsumer, Producer, TopicPartition

RATE_PER_S = 10_000
LATENCY_SECONDS = 5.0
SESSION_TIMEOUT_MS = 3_000


def _consume(bootstrap: str, topic: str, ordered: bool, total: int, ready: Any, results: Any) -> None:
    """In its own process. perf_counter is CLOCK_MONOTONIC, shared by every process here."""
    samples: list[float] = []
    deadline = time.monotonic() + LATENCY_SECONDS + 30
    if ordered:
        with OrderedConsumer(bootstrap, topic, from_beginning=False, fetch_max_wait_ms=100) as reader:
            reader.poll(timeout_ms=300)
            ready.set()
            while len(samples) < total and time.monotonic() < deadline:
                records = reader.poll(timeout_ms=100)
                now = time.perf_counter_ns()
                samples.extend((now - int(r.value[:20])) / 1e9 for r in records if r.value)
    else:
        with Consumer(bootstrap, fetch_max_wait_ms=100) as consumer:
            consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
            consumer.seek_to_end()
            consumer.poll_batches(timeout_ms=0)
            ready.set()
            while len(samples) < total and time.monotonic() < deadline:
                for batch in consumer.poll_batches(timeout_ms=100):
                    now = time.perf_counter_ns()
                    samples.extend((now - int(v[:20])) / 1e9 for v in batch.values if v)
    results.put((ordered, samples))


def end_to_end(bootstrap: str, topic: str) -> dict[str, dict[str, float]]:
    total = int(RATE_PER_S * LATENCY_SECONDS)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    readies = [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=_consume, args=(bootstrap, topic, ordered, total, ready, results), daemon=True)
             for ordered, ready in zip((False, True), readies, strict=True)]
    with quiet_children():
        for proc in procs:
            proc.start()
    out: dict[str, dict[str, float]] = {}
    try:
        for ready in readies:
            ready.wait(60)
        with Producer(bootstrap, acks="all", linger_ms=0) as producer:
            for _ in paced(total, RATE_PER_S):
                producer.send(topic, b"%020d" % time.perf_counter_ns() + VALUE[:80])
            producer.flush(timeout=60)
        for _ in procs:
            ordered, samples = results.get(timeout=90)
            out["ordered" if ordered else "plain"] = latency_summary_ms(samples)
    finally:
        join_or_kill(procs)
    return out


def sequencer_failovers(cluster: LocalCluster, topic: str, rounds: int) -> list[float]:
    acks: list[tuple[float, float]] = []
    stop = threading.Event()

    def on_ack(sent: float) -> Any:
        def done(_meta: Any, exc: BaseException | None) -> None:
            if exc is None:
                acks.append((sent, time.monotonic()))
        return done

    def write() -> None:
        with Producer(cluster.bootstrap, acks="all", linger_ms=1, request_timeout_ms=10_000,
                      delivery_timeout_ms=120_000) as producer:
            while not stop.is_set():
                producer.send(topic, VALUE).add_callback(on_ack(time.monotonic()))
                time.sleep(0.002)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    out: list[float] = []
    try:
        for _ in range(rounds):
            time.sleep(1.0)
            active = cluster.wait_for_active_sequencer()
            killed = time.monotonic()
            cluster.sequencers[active].kill()
            deadline = killed + 60
            while not any(s > killed for s, _a in acks) and time.monotonic() < deadline:
                time.sleep(0.01)
            out.append(min((a for s, a in acks if s > killed), default=float("nan")) - killed)
            cluster.sequencers[active].start()
            time.sleep(1.0)
    finally:
        stop.set()
        writer.join(timeout=120)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.strict_order", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=200_000)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--failovers", type=non_negative_int, default=3)
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"bench": "strict_order", "messages": args.messages, "repeats": args.repeats,
                               "partitions": PARTITIONS, "latency_rate_per_s": RATE_PER_S,
                               "session_timeout_ms": SESSION_TIMEOUT_MS}
    print(f"# python -m bench.strict_order {' '.join(argv if argv is not None else sys.argv[1:])}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fabric-bench-strict-") as tmp, \
            LocalCluster(3, Path(tmp) / "cluster", session_timeout_ms=SESSION_TIMEOUT_MS, sequencer_count=2) as cluster:
        bootstrap = cluster.bootstrap
        with Admin(bootstrap) as admin:
            admin.create_topic("normal", partitions=PARTITIONS)
            admin.create_topic("strict", partitions=PARTITIONS, strict_order=True)
            admin.create_topic("latency", partitions=PARTITIONS, strict_order=True)
            admin.create_topic("failover", partitions=PARTITIONS, strict_order=True)
        rates: dict[str, list[float]] = {"normal": [], "strict": []}
        for _ in range(args.repeats):
            for name in ("normal", "strict"):
                rates[name].append(throughput(bootstrap, name, args.messages, "all"))
        normal, strict = median(rates["normal"]), median(rates["strict"])
        figures["produce_msgs_per_s"] = {"normal": round(normal), "strict": round(strict)}
        figures["ratio_strict_to_normal"] = round(strict / normal, 3)
        print(f"produce, RF 3 acks=all: normal {normal:,.0f} msg/s, strict-order {strict:,.0f} msg/s, "
              f"ratio {strict / normal:.2f}", flush=True)
        latency = end_to_end(bootstrap, "latency")
        figures["e2e_latency_ms"] = latency
        added = {k: round(latency["ordered"][k] - latency["plain"][k], 3) for k in ("p50_ms", "p99_ms")}
        figures["ordered_added_latency_ms"] = added
        print(f"end to end at {RATE_PER_S:,} msg/s: plain p50 {latency['plain']['p50_ms']} ms "
              f"p99 {latency['plain']['p99_ms']} ms; ordered p50 {latency['ordered']['p50_ms']} ms "
              f"p99 {latency['ordered']['p99_ms']} ms; ordering adds p50 {added['p50_ms']} ms, "
              f"p99 {added['p99_ms']} ms", flush=True)
        if args.failovers:
            times, never = ended(sequencer_failovers(cluster, "failover", args.failovers))
            figures["sequencer_failover_s"] = {"median": round(median(times), 3),
                                               "max": round(max(times, default=float("nan")), 3),
                                               "never_ended": never}
            print(f"kill -9 of the active sequencer -> next acknowledged strict-order write: median "
                  f"{median(times):.2f} s, max {max(times, default=float('nan')):.2f} s over {len(times)}"
                  f"{f', {never} more never ended within 60 s' if never else ''} (session timeout "
                  f"{SESSION_TIMEOUT_MS} ms)", flush=True)
    print(json_line(figures))
    return 0


if __name__ == "__main__":
    run(main)

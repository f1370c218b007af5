"""Replication costs on a local three-node cluster, all in one run.

    python -m bench.replication [--messages 300000] [--repeats 3] [--failovers 5]

1. Produce throughput for RF=1 acks=1, RF=3 acks=1 and RF=3 acks=all (idempotent),
   100-byte messages, 6 partitions, one producer; median of ``--repeats`` runs. Those
   send one value again and again (as Kafka's producer-perf-test does), which lz4 shrinks
   about a hundredfold; RF=3 acks=all is also run with a distinct random value per record
   (made before the clock starts), which it cannot shrink: the nodes then store and
   replicate every byte.
2. Produce latency (send() to acknowledgement) p50/p99/p99.9 for the same three, at a
   fixed 10,000 messages per second with linger_ms=1.
3. End-to-end latency (send() to a consumer's poll returning it) at 10,000 messages per
   second on RF=3 acks=all, with linger_ms=0 and with linger_ms=1 (at this rate a 1 ms
   linger batches about ten records per request, which on a loaded machine costs less
   latency than it adds), both at the default max_in_flight=5, and with linger_ms=0 and
   max_in_flight=1 (each partition's records wait while one request of it is out, so
   they batch by themselves without a linger: the lowest latency on this machine).
4. Failover: SIGKILL the leader of a partition that is being written, time until the
   next acks=all write on that partition is acknowledged; median over ``--failovers``.

Last line: one JSON object; ``ratio_rf3_all_to_rf1`` is RF=3 acks=all throughput over
RF=1 acks=1 throughput from the same run.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._cli import join_or_kill, json_line, non_negative_int, positive_int, quiet_children, run
from bench.stats import ended, latency_summary_ms, median
from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition

PARTITIONS = 6
VALUE = b"v" * 100
RATE_PER_S = 10_000
LATENCY_SECONDS = 5.0
SESSION_TIMEOUT_MS = 3_000

CONFIGS = (("rf1_acks1", 1, 1), ("rf3_acks1", 3, 1), ("rf3_all", 3, "all"))


def throughput(bootstrap: str, topic: str, n: int, acks: Any, values: list[bytes] | None = None) -> float:
    before = end_offsets(bootstrap, topic)
    with Producer(bootstrap, acks=acks, linger_ms=5) as producer:
        producer.send(topic, b"warm-up").result(30)
        started = time.perf_counter()
        send = producer.send
        for value in values if values is not None else itertools.repeat(VALUE, n):
            send(topic, value)
        producer.flush(timeout=300)
        elapsed_s = time.perf_counter() - started
    # A figure counts only if every record sent is in the log: flush() also returns once
    # batches have failed.
    stored = records_since(bootstrap, before)
    if stored != n + 1:
        raise SystemExit(f"topic {topic!r} took {stored} records, {n + 1} were sent: the figure would be wrong")
    return n / elapsed_s


def end_offsets(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    with Consumer(bootstrap) as consumer:
        return consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])


def records_since(bootstrap: str, start: dict[TopicPartition, int]) -> int:
    """The records from ``start`` to the end, read and counted: not the end offsets' growth,
    which on a strict-order topic (bench.strict_order) also counts its leaders' ticks."""
    with Consumer(bootstrap) as consumer:
        tps = list(start)
        end = consumer.end_offsets(tps)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start[tp])
        count = 0
        while any(consumer.position(tp) < end[tp] for tp in tps):
            batches = consumer.poll_batches(timeout_ms=5_000)
            if not batches:
                break  # nothing more to read: the count says what is missing
            count += sum(len(batch) for batch in batches)
    return count


def paced(count: int, rate_per_s: float) -> Any:
    """Yield i at a fixed rate (sleeping ahead, catching up without bursts beyond schedule)."""
    started = time.perf_counter()
    for i in range(count):
        ahead = i / rate_per_s - (time.perf_counter() - started)
        if ahead > 0:
            time.sleep(ahead)
        yield i


def _latency_callback(samples: list[float], sent: float) -> Any:
    def done(_meta: Any, exc: BaseException | None) -> None:
        if exc is None:
            samples.append(time.perf_counter() - sent)

    return done


def produce_latency(bootstrap: str, topic: str, acks: Any) -> dict[str, float]:
    samples: list[float] = []
    with Producer(bootstrap, acks=acks, linger_ms=1) as producer:
        producer.send(topic, b"warm-up").result(30)
        for _ in paced(int(RATE_PER_S * LATENCY_SECONDS), RATE_PER_S):
            producer.send(topic, VALUE).add_callback(_latency_callback(samples, time.perf_counter()))
        producer.flush(timeout=60)
    return latency_summary_ms(samples)


def _consume_latencies(bootstrap: str, topic: str, total: int, ready: Any, results: Any) -> None:
    """In its own process, as a real consumer would be. perf_counter is CLOCK_MONOTONIC,
    one clock for every process on the machine, so send and receive times compare."""
    samples: list[float] = []
    with Consumer(bootstrap, fetch_max_wait_ms=100) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_end()
        consumer.poll_batches(timeout_ms=0)
        ready.set()
        deadline = time.monotonic() + LATENCY_SECONDS + 30
        while len(samples) < total and time.monotonic() < deadline:
            for batch in consumer.poll_batches(timeout_ms=100):
                now = time.perf_counter_ns()
                samples.extend((now - int(v[:20])) / 1e9 for v in batch.values if v)
    results.put(samples)


def end_to_end_latency(bootstrap: str, topic: str, linger_ms: int = 0, max_in_flight: int = 5) -> dict[str, float]:
    total = int(RATE_PER_S * LATENCY_SECONDS)
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    consumer = ctx.Process(target=_consume_latencies, args=(bootstrap, topic, total, ready, results), daemon=True)
    with quiet_children():
        consumer.start()
    try:
        ready.wait(60)
        with Producer(bootstrap, acks="all", linger_ms=linger_ms, max_in_flight=max_in_flight) as producer:
            for _ in paced(total, RATE_PER_S):
                producer.send(topic, b"%020d" % time.perf_counter_ns() + VALUE[:80])
            producer.flush(timeout=60)
        samples = results.get(timeout=90)
    finally:
        join_or_kill([consumer])
    return latency_summary_ms(samples)


def failovers(cluster: LocalCluster, topic: str, rounds: int) -> list[float]:
    """Kill the leader of partition 0 while a producer writes to it; time from the kill to
    the first acknowledgement of a write *sent after* the kill (only a new leader can give
    that; an ack in flight at the kill does not count)."""
    out: list[float] = []
    acks: list[tuple[float, float]] = []  # (sent, acknowledged), monotonic seconds
    stop = threading.Event()

    def on_ack(sent: float) -> Any:
        def done(_meta: Any, exc: BaseException | None) -> None:
            if exc is None:
                acks.append((sent, time.monotonic()))
        return done

    def write() -> None:
        with Producer(cluster.bootstrap, acks="all", linger_ms=1, request_timeout_ms=10_000) as producer:
            while not stop.is_set():
                producer.send(topic, VALUE, partition=0).add_callback(on_ack(time.monotonic()))
                time.sleep(0.002)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with Admin(cluster.bootstrap) as admin:
        for _ in range(rounds):
            time.sleep(1.0)
            leader = admin.describe_topic(topic).partitions[0].leader
            killed = time.monotonic()
            cluster.nodes[leader].kill()
            deadline = killed + 60
            while not any(s > killed for s, _a in acks) and time.monotonic() < deadline:
                time.sleep(0.01)
            out.append(min((a for s, a in acks if s > killed), default=float("nan")) - killed)
            cluster.nodes[leader].start()
            cluster.wait_for_nodes([leader])
            while set(admin.describe_topic(topic).partitions[0].isr) != {1, 2, 3} and time.monotonic() < deadline:
                time.sleep(0.1)
    stop.set()
    writer.join(timeout=60)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=300_000)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--failovers", type=non_negative_int, default=5)
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"bench": "replication", "messages": args.messages, "repeats": args.repeats,
                               "partitions": PARTITIONS, "message_bytes": len(VALUE), "latency_rate_per_s": RATE_PER_S,
                               "session_timeout_ms": SESSION_TIMEOUT_MS}
    with tempfile.TemporaryDirectory(prefix="fabric-bench-") as tmp, \
            LocalCluster(3, Path(tmp) / "cluster", session_timeout_ms=SESSION_TIMEOUT_MS) as cluster:
        with Admin(cluster.bootstrap) as admin:
            for name, rf, _acks in CONFIGS:
                admin.create_topic(name, partitions=PARTITIONS, replication_factor=rf)
            admin.create_topic("e2e", partitions=PARTITIONS, replication_factor=3)
            admin.create_topic("failover", partitions=1, replication_factor=3)
        print(f"three nodes, {PARTITIONS} partitions, {len(VALUE)}-byte messages")
        for name, _rf, acks in CONFIGS:
            runs = [throughput(cluster.bootstrap, name, args.messages, acks) for _ in range(args.repeats)]
            figures[f"{name}_msgs_per_s"] = round(median(runs))
            latency = produce_latency(cluster.bootstrap, name, acks)
            figures.update({f"{name}_produce_latency_{k}": v for k, v in latency.items() if k != "samples"})
            print(f"{name:>10}: {median(runs):>10,.0f} msg/s (runs {[round(r) for r in runs]}); produce latency at "
                  f"{RATE_PER_S:,}/s p50 {latency['p50_ms']} ms p99 {latency['p99_ms']} ms p99.9 {latency['p999_ms']} ms")
        random_values = [os.urandom(len(VALUE)) for _ in range(args.messages)]
        runs = [throughput(cluster.bootstrap, "rf3_all", args.messages, "all", random_values) for _ in range(args.repeats)]
        del random_values
        figures["rf3_all_random_msgs_per_s"] = round(median(runs))
        print(f"   rf3_all: {median(runs):>10,.0f} msg/s with a distinct random value per record (runs "
              f"{[round(r) for r in runs]})")
        figures["ratio_rf3_all_to_rf1"] = round(figures["rf3_all_msgs_per_s"] / figures["rf1_acks1_msgs_per_s"], 3)
        for linger_ms, max_in_flight, prefix in ((0, 5, "e2e_"), (1, 5, "e2e_linger1_"), (0, 1, "e2e_in_flight1_")):
            e2e = end_to_end_latency(cluster.bootstrap, "e2e", linger_ms, max_in_flight)
            figures.update({f"{prefix}{k}": v for k, v in e2e.items()})
            print(f"end to end at {RATE_PER_S:,}/s, RF=3 acks=all, linger_ms={linger_ms}, max_in_flight={max_in_flight}: "
                  f"p50 {e2e['p50_ms']} ms p99 {e2e['p99_ms']} ms p99.9 {e2e['p999_ms']} ms ({e2e['samples']} messages)")
        if args.failovers:
            times, never = ended(failovers(cluster, "failover", args.failovers))
            figures["failover_median_s"] = round(median(times), 3)
            figures["failover_max_s"] = round(max(times, default=float("nan")), 3)
            figures["failover_never_ended"] = never
            print(f"failover (kill -9 leader -> next acks=all ack): median {figures['failover_median_s']} s, "
                  f"max {figures['failover_max_s']} s over {len(times)}"
                  f"{f', {never} more never ended within 60 s' if never else ''}; session timeout {SESSION_TIMEOUT_MS} ms")
        print(f"RF=3 acks=all / RF=1 acks=1 throughput: {figures['ratio_rf3_all_to_rf1']}")
    print(json_line(figures))
    return 0


if __name__ == "__main__":
    run(main)

"""Queue mode: receive+ack throughput with 1, 4 and 16 workers, and how late delayed
messages arrive; Redis Streams consumer groups (XREADGROUP + XACK) beside it, same run.

    python -m bench.queues [--messages 20000] [--workers 1,4,16] [--repeats 3] [--quick]

Fabric: 3 nodes, RF 3, a queue of 4 partitions; each worker is a process receiving up to
100 messages per long poll and acknowledging them in one batched QUEUE_SETTLE. Every
lease and ack is written acks=all to ``__queue_state`` before it is answered.
Redis: one redis-server (appendonly, fsync every second), one stream, one consumer group;
each worker XREADGROUP COUNT 100, then XACK of the batch. Durability is not the same:
Redis acknowledges from memory (a crash loses up to a second), Fabric after three copies.

Messages are 100 bytes, pre-loaded before the workers start; the figure is messages
received and acknowledged per second, from the first worker start to the last ack (median
of repeats). Lateness: 200 messages sent with delays of 0.5-2 s, received by one worker;
how long after its due time each arrived (Redis Streams has no delayed delivery).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._cli import json_line, positive_int, positive_int_list, quiet_children, run
from bench._peers.servers import RedisServer, binary_missing
from bench.stats import median, percentile
from fabric.local import LocalCluster
from sdk import Admin, Producer, QueueConsumer

VALUE = b"x" * 100
PARTITIONS = 4
BATCH = 100
REDIS_GROUP = "workers"


def _fabric_worker(bootstrap: str, queue: str, total: int, acked: Any, started: Any, results: Any) -> None:
    worker = QueueConsumer(bootstrap, queue, "bench")
    started.wait()
    done = 0
    idle_rounds = 0
    while acked.value < total and idle_rounds < 10:
        batch = worker.receive(BATCH, 200)
        if not batch:
            idle_rounds += 1
            continue
        idle_rounds = 0
        worker.ack(batch)
        done += len(batch)
        with acked.get_lock():
            acked.value += len(batch)
    results.put((done, time.time()))
    worker.close()


def _redis_worker(port: int, stream: str, name: str, total: int, acked: Any, started: Any, results: Any) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=30)
    started.wait()
    done = 0
    idle_rounds = 0
    while acked.value < total and idle_rounds < 10:
        reply: Any = client.xreadgroup(REDIS_GROUP, name, {stream: ">"}, count=BATCH, block=200)
        if not reply:
            idle_rounds += 1
            continue
        idle_rounds = 0
        ids: list[Any] = [entry[0] for entry in reply[0][1]]
        client.xack(stream, REDIS_GROUP, *ids)
        done += len(ids)
        with acked.get_lock():
            acked.value += len(ids)
    results.put((done, time.time()))
    client.close()


def _run_workers(target: Any, args_for: Any, workers: int, total: int) -> float:
    ctx = mp.get_context("spawn")
    started, results, acked = ctx.Event(), ctx.Queue(), ctx.Value("q", 0)
    procs = [ctx.Process(target=target, args=(*args_for(i), total, acked, started, results)) for i in range(workers)]
    with quiet_children():
        for p in procs:
            p.start()
    try:
        time.sleep(1.0 + 0.1 * workers)  # let each process connect before the clock starts
        t0 = time.time()
        started.set()
        finished = [results.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(30)
    finally:  # also on Ctrl-C: the workers ignore SIGINT, and are not daemons
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    received = sum(n for n, _t in finished)
    end = max(t for n, t in finished if n) if received else time.time()
    if received < total:
        print(f"  warning: only {received}/{total} received")
    return received / (end - t0)


def fabric_rate(bootstrap: str, workers: int, messages: int, run: int) -> float:
    queue = f"bench-q-{workers}-{run}"
    with Admin(bootstrap) as admin:
        admin.create_queue(queue, PARTITIONS)
    with Producer(bootstrap, linger_ms=5) as producer:
        for i in range(messages):
            producer.send(queue, VALUE, partition=i % PARTITIONS)
        producer.flush()
    return _run_workers(_fabric_worker, lambda _i: (bootstrap, queue), workers, messages)


def redis_rate(port: int, workers: int, messages: int, run: int) -> float:
    import redis

    stream = f"bench-q-{workers}-{run}"
    client = redis.Redis(host="127.0.0.1", port=port)
    client.delete(stream)
    sent = 0
    while sent < messages:
        pipe = client.pipeline(transaction=False)
        for _ in range(min(1000, messages - sent)):
            pipe.xadd(stream, {b"v": VALUE})
        pipe.execute()
        sent += min(1000, messages - sent)
    client.xgroup_create(stream, REDIS_GROUP, id="0")
    client.close()
    return _run_workers(_redis_worker, lambda i: (port, stream, f"w{i}"), workers, messages)


def delay_lateness(bootstrap: str, count: int) -> dict[str, float]:
    queue = "bench-delays"
    with Admin(bootstrap) as admin:
        admin.create_queue(queue, PARTITIONS)
    rng = random.Random(7)
    due: dict[bytes, int] = {}
    with Producer(bootstrap, linger_ms=0) as producer:
        for i in range(count):
            delay = rng.randint(500, 2000)
            now_ms = int(time.time() * 1000)
            value = str(i).encode()
            due[value] = now_ms + delay
            producer.send(queue, value, delay_ms=delay, timestamp_ms=now_ms)
        producer.flush()
    late_ms: list[float] = []
    early: int = 0
    with QueueConsumer(bootstrap, queue, "lateness") as worker:
        deadline = time.monotonic() + 30
        while len(late_ms) < count and time.monotonic() < deadline:
            batch = worker.receive(100, 1000)
            received_ms = time.time() * 1000
            for m in batch:
                lateness = received_ms - due[m.value or b""]
                early += int(lateness < 0)
                late_ms.append(lateness)
            if batch:
                worker.ack(batch)
    return {"received": len(late_ms), "early": early, "median_ms": median(late_ms),
            "p99_ms": percentile(late_ms, 0.99), "max_ms": max(late_ms, default=float("nan"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queues", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=20_000)
    parser.add_argument("--workers", type=positive_int_list, default="1,4,16")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--delayed", type=positive_int, default=200)
    parser.add_argument("--quick", action="store_true", help="CI: 2,000 messages, workers 1 and 4, one repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.workers, args.repeats, args.delayed = 2_000, [1, 4], 1, 50
    counts = args.workers
    figures: dict[str, Any] = {"bench": "queues", "messages": args.messages, "repeats": args.repeats, "fabric": {}, "redis": {}}
    with tempfile.TemporaryDirectory(prefix="fabric-bench-queues-") as tmp:
        cluster = LocalCluster(3, Path(tmp) / "cluster")
        redis_missing = binary_missing("redis")
        redis = RedisServer(Path(tmp)) if redis_missing is None else None
        try:
            cluster.start()
            if redis is not None:
                redis.start()
            for workers in counts:
                fab = [fabric_rate(cluster.bootstrap, workers, args.messages, r) for r in range(args.repeats)]
                figures["fabric"][workers] = median(fab)
                line = f"{workers:>3} workers: fabric {median(fab):>9,.0f} msg/s"
                if redis is not None:
                    red = [redis_rate(redis.port, workers, args.messages, r) for r in range(args.repeats)]
                    figures["redis"][workers] = median(red)
                    line += f"   redis streams {median(red):>9,.0f} msg/s   ratio {median(fab) / median(red):.2f}"
                print(line, flush=True)
            if redis is None:
                print(f"redis streams: skipped ({redis_missing})")
            figures["delay_lateness"] = delay_lateness(cluster.bootstrap, args.delayed)
            lat = figures["delay_lateness"]
            print(f"delayed messages: {lat['received']} received, {lat['early']} early, lateness median "
                  f"{lat['median_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms")
        finally:
            if redis is not None:
                redis.stop()
            cluster.stop()
    print(json_line(figures))
    return 0


if __name__ == "__main__":
    run(main)

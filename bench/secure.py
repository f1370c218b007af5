"""What secure mode costs: produce and consume throughput and end-to-end latency, secure vs
plaintext, in the same run on the same machine.

    python -m bench.secure [--messages 200000] [--size 100] [--nodes 3] [--repeats 3]

Two local clusters, one plaintext and one started as ``fabric up --secure`` does (CURVE on
every node socket, the ZAP handler, the ACL check on every request; the client is the
operator, a super principal, so the check is a dictionary lookup and no ACL scan). Each
run: one Producer (acks=all, lz4, linger 5 ms) sends N messages to a topic with
replication factor ``min(3, nodes)`` (so replication runs over CURVE too), then one
Consumer reads them back with ``poll_batches``. Latency: 1,000 single messages, 2 ms apart,
acks=1, from ``send`` to the consumer's ``poll`` in the same process. Figures are medians
over ``--repeats``; the ratio secure/plaintext is the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._cli import json_line, positive_int, run
from bench.stats import latency_summary_ms, median
from fabric.auth.curve import ClientSecurity
from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition

PARTITIONS = 4
LATENCY_SAMPLES = 1_000
LATENCY_GAP_S = 0.002
CONSUME_WAIT_S = 120.0


def throughput(bootstrap: str, security: ClientSecurity | None, topic: str, n: int, size: int,
               replication: int) -> tuple[float, float]:
    with Admin(bootstrap, security=security) as admin:
        admin.create_topic(topic, partitions=PARTITIONS, replication_factor=replication)
    value = os.urandom(size // 2).hex().encode()[:size]
    with Producer(bootstrap, acks="all", linger_ms=5, compression="lz4", security=security) as producer:
        producer.send(topic, b"warm-up").result(30)
        started = time.perf_counter()
        for _ in range(n):
            producer.send(topic, value)
        producer.flush(timeout=300)
        produce_s = time.perf_counter() - started
    with Consumer(bootstrap, security=security) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        count = 0
        started = time.perf_counter()
        deadline = time.monotonic() + CONSUME_WAIT_S
        while count < n + 1 and time.monotonic() < deadline:
            for batch in consumer.poll_batches(timeout_ms=1_000):
                count += len(batch)
        consume_s = time.perf_counter() - started
    if count < n + 1:
        raise RuntimeError(f"consumed {count} of {n + 1} records")
    return produce_s, consume_s


def latency(bootstrap: str, security: ClientSecurity | None, topic: str, replication: int) -> list[float]:
    with Admin(bootstrap, security=security) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=replication)
    samples: list[float] = []
    done = threading.Event()
    ready = threading.Event()

    def consume() -> None:
        with Consumer(bootstrap, security=security) as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            ready.set()
            deadline = time.monotonic() + CONSUME_WAIT_S
            while len(samples) < LATENCY_SAMPLES and time.monotonic() < deadline:
                for record in consumer.poll(timeout_ms=200):
                    samples.append(time.perf_counter() - struct.unpack(">d", (record.value or b"")[:8])[0])
        done.set()

    reader = threading.Thread(target=consume, name="latency-consumer", daemon=True)
    reader.start()
    ready.wait(30)
    with Producer(bootstrap, acks=1, linger_ms=0, security=security) as producer:
        for _ in range(LATENCY_SAMPLES):
            producer.send(topic, struct.pack(">d", time.perf_counter()) + b"x" * 92)
            time.sleep(LATENCY_GAP_S)
        producer.flush(timeout=60)
    done.wait(CONSUME_WAIT_S)
    reader.join(5)
    if len(samples) < LATENCY_SAMPLES:
        raise RuntimeError(f"latency consumer saw {len(samples)} of {LATENCY_SAMPLES} records")
    return samples


def measure(cluster: LocalCluster, label: str, args: argparse.Namespace) -> dict[str, Any]:
    security = cluster.security.client() if cluster.security is not None else None
    replication = min(3, args.nodes)
    runs = [throughput(cluster.bootstrap, security, f"bench-{label}-{r}", args.messages, args.size, replication)
            for r in range(args.repeats)]
    lat = latency(cluster.bootstrap, security, f"bench-{label}-latency", replication)
    return {
        "produce_msgs_per_s": round(args.messages / median([p for p, _ in runs])),
        "consume_msgs_per_s": round(args.messages / median([c for _, c in runs])),
        **{f"e2e_{k}": v for k, v in latency_summary_ms(lat).items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.secure", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=positive_int, default=200_000)
    parser.add_argument("--size", type=positive_int, default=100)
    parser.add_argument("--nodes", type=positive_int, default=3)
    parser.add_argument("--repeats", type=positive_int, default=3)
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"bench": "secure", "messages": args.messages, "size": args.size, "nodes": args.nodes,
                               "repeats": args.repeats, "acks": "all", "compression": "lz4"}
    print(f"{args.nodes} nodes, replication {min(3, args.nodes)}, acks=all, lz4, {args.messages:,} messages of "
          f"{args.size} bytes per run, {args.repeats} runs; latency: {LATENCY_SAMPLES} messages, acks=1", flush=True)
    with tempfile.TemporaryDirectory(prefix="fabric-bench-secure-") as tmp:
        results = {}
        for label, secure in (("plaintext", False), ("secure", True)):
            with LocalCluster(args.nodes, Path(tmp) / label, secure=secure) as cluster:
                results[label] = measure(cluster, label, args)
            print(f"{label:10s} {json.dumps(results[label])}", flush=True)
    for key, value in results["plaintext"].items():
        figures[f"plaintext_{key}"] = value
        figures[f"secure_{key}"] = results["secure"][key]
        if value and key != "e2e_samples":
            figures[f"{key}_ratio_secure_to_plaintext"] = round(results["secure"][key] / value, 3)
    print(json_line(figures))  # one line, the last: what every benchmark prints
    return 0


if __name__ == "__main__":
    run(main)

"""Read throughput of the Spark connector against the SDK consumer, in one run.

    python -m bench.spark_read [--messages 1000000] [--size 100] [--partitions 4] [--bootstrap zk://...]

Both read the same N records of ``--size`` bytes. The connector runs
``spark.read.format("fabric")...select(count(*), sum(length(value)))``, which makes every
task fetch, decode and hand every value to Spark (a bare ``count()`` could be answered
without looking at the values). The SDK side is one Consumer with ``poll_batches()`` that
also touches every value. Both check every batch's CRC (the SDK's default, and the
connector's).

Start-up and warm-up are excluded, for both readers alike: the Spark session is created,
then ``--warmup`` untimed rounds read the whole topic through the connector and through
the SDK consumer (the JVM compiles Spark's per-row code during the first million rows or
so; a first read is 1.5-2x slower than the steady state a long-running job sees). The
session start and the warm-up times are reported. Then ``--repeats`` timed rounds; the
medians are compared. The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from bench import _cli
from bench.stats import median
from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition

PRODUCE_TIMEOUT_S = 600.0


def produce(bootstrap: str, topic: str, partitions: int, n: int, size: int) -> float:
    with Admin(bootstrap) as admin:
        # Up to 3 replicas, as many as there are nodes (the default 1-node cluster allows 1).
        admin.create_topic(topic, partitions=partitions, replication_factor=min(3, len(admin.nodes())))
    # Distinct incompressible-ish values: lz4 does not shrink them much, as with real payloads.
    value = os.urandom(size // 2).hex().encode()[:size]
    started = time.perf_counter()
    with Producer(bootstrap, acks=1, linger_ms=5, compression="lz4") as producer:
        for i in range(n):
            producer.send(topic, value, partition=i % partitions)
        producer.flush(PRODUCE_TIMEOUT_S)
    return time.perf_counter() - started


def read_sdk(bootstrap: str, topic: str, partitions: int, n: int) -> tuple[float, int]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        count = value_bytes = 0
        started = last = time.perf_counter()
        while _cli.read_stalled(count, n, last):
            for batch in consumer.poll_batches(timeout_ms=10_000):
                count += len(batch)
                value_bytes += sum(map(len, batch.values))  # type: ignore[arg-type]
                last = time.perf_counter()
        return time.perf_counter() - started, value_bytes


def read_connector(spark: Any, bootstrap: str, topic: str) -> tuple[float, int, int]:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    row = (spark.read.format("fabric").option("bootstrap", bootstrap).option("subscribe", topic).load()
           .select(F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes")).collect()[0])
    return time.perf_counter() - started, int(row["n"]), int(row["bytes"] or 0)


def start_spark(cores: int) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import spark_connector

    spark = (SparkSession.builder.master(f"local[{cores}]").appName("fabric-bench-spark-read")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(cores))
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    return spark


def run(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    n, size, partitions = args.messages, args.size, args.partitions
    topic = f"bench-spark-read-{os.getpid()}"
    print(f"producing {n:,} messages of {size} bytes into {partitions} partitions ...", flush=True)
    produce_s = produce(bootstrap, topic, partitions, n, size)

    started = time.perf_counter()
    spark = start_spark(args.cores)
    spark_start_s = time.perf_counter() - started
    try:
        def one_round() -> tuple[float, float]:
            seconds, count, value_bytes = read_connector(spark, bootstrap, topic)
            if count != n or value_bytes != n * size:
                raise SystemExit(f"connector read {count} records / {value_bytes} value bytes, expected {n} / {n * size}")
            sdk_seconds, sdk_bytes = read_sdk(bootstrap, topic, partitions, n)
            if sdk_bytes != n * size:
                raise SystemExit(f"SDK read {sdk_bytes} value bytes, expected {n * size}")
            return seconds, sdk_seconds

        print(f"Spark session started in {spark_start_s:.1f} s (not timed)", flush=True)
        warmup_runs = []
        for attempt in range(args.warmup):
            seconds, sdk_seconds = one_round()
            warmup_runs.append(seconds)
            print(f"warm-up {attempt + 1} (not timed): connector {seconds:.2f} s, SDK consumer {sdk_seconds:.2f} s",
                  flush=True)
        connector_runs, sdk_runs = [], []
        for attempt in range(args.repeats):
            seconds, sdk_seconds = one_round()
            connector_runs.append(seconds)
            sdk_runs.append(sdk_seconds)
            print(f"run {attempt + 1}: connector {n / seconds:,.0f} msg/s ({seconds:.2f} s), "
                  f"SDK consumer {n / sdk_seconds:,.0f} msg/s ({sdk_seconds:.2f} s)", flush=True)
    finally:
        spark.stop()
    connector_s, sdk_s = median(connector_runs), median(sdk_runs)
    return {
        "bench": "spark_read",
        "messages": n,
        "value_bytes": size,
        "partitions": partitions,
        "spark_cores": args.cores,
        "repeats": args.repeats,
        "check_crc": True,
        "produce_msgs_per_s": round(n / produce_s),
        "connector_msgs_per_s": round(n / connector_s),
        "sdk_msgs_per_s": round(n / sdk_s),
        "connector_mb_per_s": round(n * size / connector_s / 1e6, 1),
        "sdk_mb_per_s": round(n * size / sdk_s / 1e6, 1),
        "ratio_connector_to_sdk": round(sdk_s / connector_s, 3),
        "spark_start_s_excluded": round(spark_start_s, 2),
        "warmup_connector_s_excluded": [round(w, 2) for w in warmup_runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_read", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=_cli.positive_int, default=1_000_000)
    parser.add_argument("--size", type=_cli.positive_int, default=100, help="value bytes per message")
    parser.add_argument("--partitions", type=_cli.positive_int, default=4)
    parser.add_argument("--cores", type=_cli.positive_int, default=2, help="Spark local[N]")
    parser.add_argument("--repeats", type=_cli.positive_int, default=3, help="timed runs of each reader; medians reported")
    parser.add_argument("--warmup", type=_cli.non_negative_int, default=2, help="untimed rounds of both readers first (JIT warm-up)")
    parser.add_argument("--nodes", type=_cli.positive_int, default=1, help="nodes of the local cluster (without --bootstrap)")
    parser.add_argument("--bootstrap", help="an existing cluster (zk://host:port); default: start a local one")
    args = parser.parse_args(argv)
    if args.bootstrap:
        result = run(args, args.bootstrap)
    else:
        with LocalCluster(args.nodes) as cluster:
            result = run(args, cluster.bootstrap)
    print(_cli.json_line(result))
    return 0


if __name__ == "__main__":
    _cli.run(main)

"""Clickstream pipeline: events into Fabric, per-user windowed aggregates out to a topic and Parquet.

    python -m spark_connector.examples.clickstream                      # starts its own local cluster
    python -m spark_connector.examples.clickstream --bootstrap zk://127.0.0.1:2181   # `fabric up`'s cluster

1. A producer thread sends click events (JSON, keyed by user, timestamped with the event
   time) into the topic ``clicks-<run>``, in two waves so that the stream sees data arrive.
2. Streaming query A reads ``clicks-<run>``, counts views, clicks and purchases per user per
   one-minute event-time window with a watermark (append mode: a window is written once,
   when the watermark has passed it), and writes each closed window to the topic
   ``clicks-per-user-<run>`` through the exactly-once fabric sink. A final heartbeat event,
   far ahead in event time, closes the last windows; its own window never closes, so it
   is not counted.
3. Streaming query B reads those aggregates back from Fabric and archives them as Parquet.
4. A batch query over the Parquet files checks that every (user, window) is there once and
   that the windows add up to exactly the number of events sent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sdk import Admin, Producer

ACTIONS = (("view", 0.7), ("click", 0.25), ("buy", 0.05))
WINDOW = "1 minute"
SPAN_MS = 10 * 60 * 1000  # the simulated event time covers ten minutes
HEARTBEAT_USER = "__heartbeat__"


def make_events(count: int, users: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    start_ms = int(time.time() * 1000) - SPAN_MS
    events = []
    for i in range(count):
        action = rng.choices([a for a, _ in ACTIONS], weights=[w for _, w in ACTIONS])[0]
        events.append({
            "user": f"user-{rng.randrange(users):03d}",
            "page": f"/products/{rng.randrange(40)}",
            "action": action,
            "ts": start_ms + i * SPAN_MS // count,
        })
    # Not a click: moves event time past the watermark so the last windows close.
    events.append({"user": HEARTBEAT_USER, "page": "", "action": "heartbeat", "ts": start_ms + SPAN_MS + 5 * 60_000})
    return events


def send_events(bootstrap: str, topic: str, events: list[dict[str, Any]]) -> None:
    with Producer(bootstrap, acks="all", linger_ms=20) as producer:
        for event in events:
            producer.send(topic, json.dumps(event).encode(), key=event["user"], timestamp_ms=event["ts"])
        producer.flush(120)


def start_spark() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import spark_connector

    spark = (SparkSession.builder.master("local[2]").appName("fabric-clickstream")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    return spark


def aggregate_query(spark: Any, bootstrap: str, clicks: str, results: str, checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    schema = "user string, page string, action string, ts long"
    events = (spark.readStream.format("fabric").option("bootstrap", bootstrap).option("subscribe", clicks)
              .option("startingOffsets", "earliest").load()
              .select(F.from_json(F.col("value").cast("string"), schema).alias("e"), "timestamp")
              .select("e.*", F.col("timestamp").alias("event_time")))
    # No filter for the heartbeat: Spark would push it below the watermark, which then
    # would not move. Its own window stays open (ahead of the watermark), so it is never output.
    per_user = (events.withWatermark("event_time", "2 minutes")
                .groupBy(F.window("event_time", WINDOW), "user")
                .agg(F.count("*").alias("events"),
                     F.sum(F.when(F.col("action") == "view", 1).otherwise(0)).alias("views"),
                     F.sum(F.when(F.col("action") == "click", 1).otherwise(0)).alias("clicks"),
                     F.sum(F.when(F.col("action") == "buy", 1).otherwise(0)).alias("buys"),
                     F.approx_count_distinct("page").alias("pages")))
    out = per_user.select(
        F.col("user").alias("key"),
        F.to_json(F.struct(F.col("user"), F.col("window.start").alias("window_start"),
                           "events", "views", "clicks", "buys", "pages")).alias("value"))
    return (out.writeStream.format("fabric").outputMode("append").option("bootstrap", bootstrap)
            .option("topic", results).option("checkpointLocation", str(checkpoint)).queryName("per_user").start())


def archive_query(spark: Any, bootstrap: str, results: str, parquet: Path, checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    schema = "user string, window_start timestamp, events long, views long, clicks long, buys long, pages long"
    rows = (spark.readStream.format("fabric").option("bootstrap", bootstrap).option("subscribe", results)
            .option("startingOffsets", "earliest").load()
            .select(F.from_json(F.col("value").cast("string"), schema).alias("a"), "partition", "offset")
            .select("a.*", "partition", "offset"))
    return (rows.writeStream.format("parquet").option("path", str(parquet))
            .option("checkpointLocation", str(checkpoint)).queryName("archive").start())


def run(bootstrap: str, args: argparse.Namespace) -> int:
    run_id = f"{int(time.time())}-{os.getpid()}"
    clicks, results = f"clicks-{run_id}", f"clicks-per-user-{run_id}"
    work = Path(args.out or tempfile.mkdtemp(prefix="fabric-clickstream-"))
    with Admin(bootstrap) as admin:
        admin.create_topic(clicks, partitions=4)
        admin.create_topic(results, partitions=2)
    events = make_events(args.events, args.users, args.seed)
    clicks_sent = len(events) - 1  # without the heartbeat
    half = len(events) // 2
    print(f"topics {clicks} -> {results}; output under {work}", flush=True)
    send_events(bootstrap, clicks, events[:half])

    spark = start_spark()
    try:
        query_a = aggregate_query(spark, bootstrap, clicks, results, work / "checkpoints" / "per_user")
        query_b = archive_query(spark, bootstrap, results, work / "parquet", work / "checkpoints" / "archive")
        query_a.processAllAvailable()
        second_wave = threading.Thread(target=send_events, args=(bootstrap, clicks, events[half:]))
        second_wave.start()  # arrives while the queries run
        second_wave.join()
        query_a.processAllAvailable()
        query_b.processAllAvailable()
        query_a.stop()
        query_b.stop()

        from pyspark.sql import functions as F

        archived = spark.read.parquet(str(work / "parquet"))
        windows = archived.count()
        distinct = archived.select("user", "window_start").distinct().count()
        total = archived.agg(F.sum("events")).collect()[0][0]
        print(f"\n{windows} closed (user, minute) windows archived, {distinct} distinct")
        print("top users over the whole run:")
        (archived.groupBy("user").agg(F.sum("events").alias("events"), F.sum("clicks").alias("clicks"),
                                    F.sum("buys").alias("buys"))
         .orderBy(F.desc("events"), "user").show(5, truncate=False))
        ok = total == clicks_sent and windows == distinct
        print(f"events sent {clicks_sent}, events counted in the windows {total}: "
              f"{'exactly once' if ok else 'MISMATCH'}")
        print(json.dumps({"events": clicks_sent, "counted": total, "windows": windows,
                          "parquet": str(work / "parquet"), "results_topic": results}))
        return 0 if ok else 1
    finally:
        for query in spark.streams.active:
            query.stop()
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fabric + Spark clickstream pipeline")
    parser.add_argument("--bootstrap", help="cluster to use, e.g. the zk://... that `fabric up` prints; "
                                            "default: start a local cluster for this run")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", help="directory for Parquet and checkpoints (default: a new temp dir)")
    args = parser.parse_args(argv)
    if args.bootstrap:
        return run(args.bootstrap, args)
    from fabric.local import LocalCluster

    print("no --bootstrap: starting a local cluster (ZooKeeper + 3 nodes) for this run ...", flush=True)
    with LocalCluster(3) as cluster:
        return run(cluster.bootstrap, args)


if __name__ == "__main__":
    sys.exit(main())

"""One SparkSession (local[2]) for every Spark test, plus helpers to produce and read back.

The session starts once (about 10 s) and its JVM is shut down when the test session
ends, so no java process outlives pytest. Streaming tests each use their own checkpoint
directory and wait with ``processAllAvailable()``, never with sleeps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from sdk import Admin, Consumer, Producer, TopicPartition

JVM_EXIT_TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    import spark_connector

    session = (
        SparkSession.builder.master("local[2]")
        .appName("fabric-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_connector.register(session)
    gateway = SparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
        if gateway is not None:
            gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # the JVM exits when its stdin closes
            try:
                proc.wait(JVM_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(JVM_EXIT_TIMEOUT_S)


def create_topic(bootstrap: str, name: str, partitions: int, **config: Any) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(name, partitions=partitions, replication_factor=1, config=config or None)


def produce(bootstrap: str, topic: str, values: list[bytes], *, partition: int | None = None,
            keys: list[bytes] | None = None, headers: list[Any] | None = None) -> None:
    """Send and wait for every ack; each record goes to ``partition`` or by key / sticky."""
    with Producer(bootstrap, acks="all", linger_ms=1) as producer:
        futures = [
            producer.send(topic, value, key=keys[i] if keys else None,
                          headers=headers[i] if headers else None, partition=partition)
            for i, value in enumerate(values)
        ]
        producer.flush(60)
        for future in futures:
            future.result(60)


def read_all(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of the topic as (partition, offset, key, value), via the SDK."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        end = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, consumer.beginning_offsets([tp])[tp])
        remaining = sum(end.values()) - sum(consumer.position(tp) for tp in tps)
        while remaining > 0:
            records = consumer.poll(timeout_ms=5000)
            if not records:
                raise AssertionError(f"{topic}: {remaining} records never arrived")
            for r in records:
                out.append((r.partition, r.offset, r.key, r.value))
            remaining -= len(records)
    return sorted(out, key=lambda r: (r[0], r[1]))

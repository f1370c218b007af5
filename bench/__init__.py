"""Benchmarks: figures and ratios against baselines run in the same process or run.

    python -m bench                 produce/consume throughput vs a raw pyzmq+rocksdict baseline
    python -m bench.replication     RF=1 vs RF=3, acks, latency percentiles, failover time
    python -m bench.c_client        C producer vs Python producer
    python -m bench.spark_read      Spark connector vs SDK consumer

Each prints human-readable lines and, last, one JSON object with its figures.
Benchmarks measure; they never assert a time (tests assert correctness).
"""

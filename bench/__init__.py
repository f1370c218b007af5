"""Benchmarks: figures and ratios against baselines run in the same process or run.

    python -m bench                 produce/consume throughput vs a raw pyzmq+rocksdict baseline
    python -m bench.replication     RF=1 vs RF=3, acks, latency percentiles, failover time
    python -m bench.c_client        C producer vs Python producer
    python -m bench.spark_read      Spark connector vs SDK consumer

and the others in docs/BENCHMARKS.md (its first table lists every command, its "JSON keys"
section every key each prints). Each prints human-readable lines and, last, one JSON
object with its figures; bad arguments are usage errors (exit status 2) before anything
starts, and Ctrl-C ends a run cleanly (exit status 130; ``bench._cli``).
Benchmarks measure; they never assert a time (tests assert correctness).
"""

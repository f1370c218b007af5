"""What the node's produce-path validation costs per batch (docs/PROTOCOL.md section 4.5).

    python -m bench.validate [--repeat 7] [--number 200]

For three batch shapes (many small records, medium records, few large ones; lz4, half
random half repetitive values), times ``batch.validate(contents=False)`` (header, CRC,
lz4 size claim: the checks before issue 10) and ``batch.validate()`` (also decompresses
and checks that the columns add up), and prints the medians, the extra cost per batch and
per record, and the ratio. Measures and reports only. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit

from bench._cli import json_line, positive_int, run
from fabric.protocol import batch

SHAPES = ((1_000, 100), (100, 1_000), (10, 100_000))  # (records, value bytes)


def sample(records: int, value_bytes: int) -> bytes:
    half = value_bytes // 2
    values = [os.urandom(half) + b"x" * (value_bytes - half) for _ in range(records)]
    return batch.encode_batch(list(range(records)), [b"key-%d" % i for i in range(records)], values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.validate")
    parser.add_argument("--repeat", type=positive_int, default=7)
    parser.add_argument("--number", type=positive_int, default=200)
    args = parser.parse_args(argv)
    rows = []
    for records, value_bytes in SHAPES:
        raw = sample(records, value_bytes)
        limit = len(raw)

        def shallow(raw: bytes = raw, limit: int = limit) -> None:
            batch.validate(raw, limit, contents=False)

        def full(raw: bytes = raw, limit: int = limit) -> None:
            batch.validate(raw, limit)

        shallow_us = statistics.median(timeit.repeat(shallow, number=args.number, repeat=args.repeat)) / args.number * 1e6
        full_us = statistics.median(timeit.repeat(full, number=args.number, repeat=args.repeat)) / args.number * 1e6
        row = {"records": records, "value_bytes": value_bytes, "batch_bytes": len(raw),
               "shallow_us": round(shallow_us, 1), "full_us": round(full_us, 1),
               "extra_us_per_batch": round(full_us - shallow_us, 1),
               "extra_ns_per_record": round((full_us - shallow_us) * 1000 / records),
               "extra_mb_per_s": round(len(raw) / max(full_us - shallow_us, 1e-9), 0),
               "ratio": round(full_us / shallow_us, 2)}
        rows.append(row)
        print(f"{records:>5} x {value_bytes:>6} B ({len(raw):>7} B on the wire): header+CRC {shallow_us:8.1f} us, "
              f"full {full_us:8.1f} us, extra {row['extra_us_per_batch']:7.1f} us/batch = "
              f"{row['extra_ns_per_record']} ns/record ({row['ratio']}x)")
    print(json_line({"validate": rows}))
    return 0


if __name__ == "__main__":
    run(main)

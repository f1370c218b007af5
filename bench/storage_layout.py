"""Storage layout: RocksDB alone, written the way a node writes, under two key layouts.

    python -m bench.storage_layout [--retained-gb 5] [--more-gb 10] [--partitions 4]

No node, no network: each batch (128 KiB of random bytes) and its 48-byte index entry go
in one WriteBatch, partitions interleaved, as ``nodes/log.py`` stages them. First
``--retained-gb`` are written (the fill), then ``--more-gb`` more while a retention pass
every 256 MiB deletes each partition's oldest batches so that ``--retained-gb`` stay
(the steady state). Layouts:

* ``partition``: batches keyed partition + offset beside the index in one key space,
  range deletes (how nodes stored them before the sequence);
* ``sequence``: batches keyed by a node-wide sequence, the index in its own column
  family, a point delete per batch (how nodes store them now).

Printed per layout: fill seconds, steady-state MB/s, RocksDB's cumulative compaction
writes and the bytes on disk at the end; then the ratios sequence / partition, and last
one JSON object with the same figures. Needs
about ``2 x (retained + a few GB)`` of free space in the temp dir.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import struct
import tempfile
import time

import rocksdict

from bench import _cli

VALUE_BYTES = 128 * 1024
INDEX_BYTES = 48
RETENTION_EVERY = 2048  # batches: a retention pass about every 256 MiB
_U64 = struct.Struct(">Q")


def run(layout: str, retained_gb: float, more_gb: float, partitions: int) -> dict[str, float]:
    path = tempfile.mkdtemp(prefix=f"fabric-layout-{layout}-")
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_max_background_jobs(2)  # as the node opens its store
    db = rocksdict.Rdict(path, options)
    index_cf = None
    if layout == "sequence":
        db.create_column_family("meta", options).close()
        index_cf = db.get_column_family_handle("meta")
    payload = os.urandom(VALUE_BYTES * 64)
    fill_n = int(retained_gb * 1e9 / VALUE_BYTES)
    more_n = int(more_gb * 1e9 / VALUE_BYTES)
    keep = fill_n // partitions
    live: list[collections.deque[tuple[int, int]]] = [collections.deque() for _ in range(partitions)]
    pkeys = [b"grow\x00" + struct.pack(">I", p) for p in range(partitions)]
    write_options = rocksdict.WriteOptions()
    started = time.perf_counter()
    steady_from = started
    try:
        for i in range(fill_n + more_n):
            if i == fill_n:
                steady_from = time.perf_counter()
            p, offset = i % partitions, i // partitions
            value = payload[(i % 64) * VALUE_BYTES:(i % 64 + 1) * VALUE_BYTES]
            wb = rocksdict.WriteBatch(raw_mode=True)
            if layout == "sequence":
                wb.put(b"s" + _U64.pack(i), value)
                wb.put(b"i" + pkeys[p] + _U64.pack(offset), b"x" * INDEX_BYTES, index_cf)
            else:
                wb.put(b"d" + pkeys[p] + _U64.pack(offset), value)
                wb.put(b"i" + pkeys[p] + _U64.pack(offset), b"x" * INDEX_BYTES)
            db.write(wb, write_options)
            live[p].append((offset, i))
            if i % RETENTION_EVERY == RETENTION_EVERY - 1:
                retain(db, index_cf, layout, live, pkeys, keep, write_options)
        ended = time.perf_counter()
        stats = db.property_value("rocksdb.stats") or ""
        found = re.search(r"Cumulative compaction: ([\d.]+) GB write", stats)
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    finally:
        index_cf = None
        db.close()
        shutil.rmtree(path, ignore_errors=True)
    return {
        "fill_s": (steady_from if more_n else ended) - started,
        "steady_mb_per_s": more_n * VALUE_BYTES / 1e6 / (ended - steady_from) if more_n else 0.0,
        "compaction_gb": float(found.group(1)) if found else float("nan"),
        "disk_gb": disk / 1e9,
    }


def retain(db: rocksdict.Rdict, index_cf: rocksdict.ColumnFamily | None, layout: str, live: list[collections.deque[tuple[int, int]]],
           pkeys: list[bytes], keep: int, write_options: rocksdict.WriteOptions) -> None:
    wb = rocksdict.WriteBatch(raw_mode=True)
    for p, batches in enumerate(live):
        gone = [batches.popleft() for _ in range(max(0, len(batches) - keep))]
        if not gone:
            continue
        end = _U64.pack(gone[-1][0] + 1)
        if layout == "sequence":
            for _offset, sequence in gone:
                wb.delete(b"s" + _U64.pack(sequence))
            wb.delete_range(b"i" + pkeys[p] + _U64.pack(0), b"i" + pkeys[p] + end, index_cf)
        else:
            wb.delete_range(b"d" + pkeys[p] + _U64.pack(0), b"d" + pkeys[p] + end)
            wb.delete_range(b"i" + pkeys[p] + _U64.pack(0), b"i" + pkeys[p] + end)
    db.write(wb, write_options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storage_layout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--retained-gb", type=_cli.positive_float, default=5.0)
    parser.add_argument("--more-gb", type=_cli.non_negative_float, default=10.0)
    parser.add_argument("--partitions", type=_cli.positive_int, default=4)
    args = parser.parse_args(argv)
    if int(args.retained_gb * 1e9 / VALUE_BYTES) < args.partitions:
        parser.error(f"argument --retained-gb: must hold at least one {VALUE_BYTES // 1024} KiB batch per partition")
    figures: dict[str, object] = {"bench": "storage_layout", "retained_gb": args.retained_gb, "more_gb": args.more_gb,
                                  "partitions": args.partitions, "batch_bytes": VALUE_BYTES}
    results = {}
    for layout in ("partition", "sequence"):
        results[layout] = run(layout, args.retained_gb, args.more_gb, args.partitions)
        r = results[layout]
        compaction = f"{r['compaction_gb']:.1f}" if r["compaction_gb"] == r["compaction_gb"] else "?"
        print(f"{layout:>9}: fill {args.retained_gb:g} GB in {r['fill_s']:.1f} s; steady state "
              f"{r['steady_mb_per_s']:.0f} MB/s; compaction writes {compaction} GB; "
              f"on disk {r['disk_gb']:.1f} GB", flush=True)
        for key, value in r.items():
            figures[f"{layout}_{key}"] = round(value, 4) if value == value else None  # NaN is not JSON
    a, b = results["partition"], results["sequence"]
    figures["ratio_fill_s_sequence_to_partition"] = round(b["fill_s"] / a["fill_s"], 3)
    figures["ratio_steady_mb_per_s_sequence_to_partition"] = (
        round(b["steady_mb_per_s"] / a["steady_mb_per_s"], 3) if a["steady_mb_per_s"] else None)
    steady = f", steady MB/s {b['steady_mb_per_s'] / a['steady_mb_per_s']:.2f}" if a["steady_mb_per_s"] else ""
    print(f"sequence / partition: fill time {b['fill_s'] / a['fill_s']:.2f}{steady}", flush=True)
    print(_cli.json_line(figures))
    return 0


if __name__ == "__main__":
    _cli.run(main)

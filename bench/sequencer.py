"""Sequencer figures, on a local ZooKeeper with two sequencer instances.

    python -m bench.sequencer [--seconds 5] [--clients 4] [--failovers 5]

1. Grants per second, requests and IDs, for ``--clients`` client threads each asking
   back to back (one request per grant), with 1, 100 and 1,000 IDs per request. A
   partition leader asks once per produce request, for all of its records, so the IDs
   column is what one sequencer sustains for strict-order records.
2. Failover: kill -9 the active instance while a client keeps asking; time from the kill
   to the next grant (the client follows the ZooKeeper watch to the standby). Median and
   max over ``--failovers``; bounded by the session timeout (``--session-timeout-ms``).

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from bench._cli import json_line, non_negative_int, positive_float, positive_int, run
from bench.stats import median
from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalCluster
from fabric.sequencer_client import SequencerClient


def grant_rate(zk_address: str, clients: int, ids_per_request: int, seconds: float) -> dict[str, float]:
    counts = [0] * clients
    stop = threading.Event()

    def run(index: int) -> None:
        zk = KazooClient(hosts=zk_address)
        zk.start(timeout=30)
        client = SequencerClient(zk)
        try:
            client.allocate(ids_per_request)  # connect and find the active instance first
            start.wait()
            while not stop.is_set():
                client.allocate(ids_per_request)
                counts[index] += 1
        finally:
            client.close()
            zkl.close_client(zk)

    start = threading.Event()
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    began = time.monotonic()
    try:
        time.sleep(1.0)
        began = time.monotonic()
        start.set()
        time.sleep(seconds)
    finally:
        # Also on Ctrl-C: each thread leaves its loop and closes its ZooKeeper client
        # while ZooKeeper still runs (one left waiting for start held the exit for ever).
        stop.set()
        start.set()
        elapsed = time.monotonic() - began
        for t in threads:
            t.join(timeout=30)
    requests = sum(counts)
    return {"ids_per_request": ids_per_request, "requests_per_s": round(requests / elapsed),
            "ids_per_s": round(requests * ids_per_request / elapsed)}


def failover_times(cluster: LocalCluster, failovers: int) -> list[float]:
    zk = KazooClient(hosts=cluster.zk_address)
    zk.start(timeout=30)
    client = SequencerClient(zk, request_timeout_ms=200)
    out: list[float] = []
    try:
        for _ in range(failovers):
            active = cluster.wait_for_active_sequencer()
            client.allocate(10)
            killed_at = time.monotonic()
            cluster.sequencers[active].kill()
            while True:
                try:
                    client.allocate(10, timeout_ms=60_000)
                    break
                except errors.SequencerNotAvailableError:
                    continue
            out.append(time.monotonic() - killed_at)
            cluster.sequencers[active].start()  # back as a standby
            time.sleep(1.0)
    finally:
        client.close()
        zkl.close_client(zk)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sequencer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=positive_float, default=5.0)
    parser.add_argument("--clients", type=positive_int, default=4)
    parser.add_argument("--failovers", type=non_negative_int, default=5)
    parser.add_argument("--session-timeout-ms", type=positive_int, default=3_000)
    args = parser.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # a killed instance's clients log reconnects
    summary: dict[str, Any] = {"bench": "sequencer", "clients": args.clients, "session_timeout_ms": args.session_timeout_ms}
    with tempfile.TemporaryDirectory(prefix="fabric-bench-seq-") as tmp, \
            LocalCluster(0, Path(tmp) / "cluster", sequencer_count=2,
                         session_timeout_ms=args.session_timeout_ms) as cluster:
        print(f"# python -m bench.sequencer {' '.join(argv if argv is not None else sys.argv[1:])}", flush=True)
        rates = []
        for ids in (1, 100, 1_000):
            rate = grant_rate(cluster.zk_address, args.clients, ids, args.seconds)
            rates.append(rate)
            print(f"grants  {ids:>5} IDs/request: {rate['requests_per_s']:>8,} requests/s  "
                  f"{rate['ids_per_s']:>12,} IDs/s", flush=True)
        summary["grants"] = rates
        if args.failovers:
            times = failover_times(cluster, args.failovers)
            summary["failover_s_median"] = round(median(times), 3)
            summary["failover_s_max"] = round(max(times), 3)
            print(f"failover (kill -9 of the active instance -> next grant): median {median(times):.2f} s, "
                  f"max {max(times):.2f} s over {len(times)}", flush=True)
    print(json_line(summary))
    return 0


if __name__ == "__main__":
    run(main)

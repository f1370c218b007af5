"""The direct plane against bare pyzmq, in one run.

    python -m bench.direct [--requests 20000] [--seconds 3] [--payload-bytes 100] [--repeats 3]
                           [--loop asyncio|uvloop]

Each pair is one client process (this one) and one server process:

1. Bare pyzmq: a ROUTER echo loop in a child process, a blocking DEALER here. Latency of
   ``--requests`` sequential round trips (p50/p99/p99.9), then throughput with 64
   requests in flight for ``--seconds``. Also the latency of a zmq.asyncio DEALER against
   the same server: the floor of any asyncio client.
2. Fabric direct: ``serve("echo", async handler)`` in a child process, found through
   ZooKeeper; ``await client.request(...)`` here (asyncio core). Same two figures, plus
   the blocking API (``sdk.Client.request``) latency, and the asyncio client's latency
   against a *sync* handler (``serve("echo", def handler)``, run on the instance's
   handler threads).
3. Scatter-gather: 8 instances of a service (one child process hosting 8 ROUTERs),
   ``await client.gather(...)`` latency to all 8.

``--loop uvloop`` runs the Fabric server and the Fabric asyncio client on uvloop (PyPI
``uvloop``, the ``speed`` extra) instead of the standard event loop; the bare baselines
do not change. The whole set runs ``--repeats`` times (alternating, so load changes hit every system);
each run prints its figures and its ratios (Fabric over bare pyzmq, from that run), and
the end prints the median of every figure and ratio, and the load average. Percentiles
come from HdrHistogram (PyPI ``hdrhistogram``) when installed, else from nearest-rank
over the samples. Last line: one JSON object with every run and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq

from bench._cli import json_line, positive_float, positive_int, quiet_children, run
from fabric.local import LocalZooKeeper, free_port

IN_FLIGHT = 64
GATHER_INSTANCES = 8
ROOT = Path(__file__).resolve().parents[1]


def summary_us(samples_ns: Sequence[int]) -> dict[str, float]:
    """p50/p99/p99.9 in microseconds."""
    try:
        from hdrh.histogram import HdrHistogram
    except ImportError:
        from bench.stats import percentile

        us = [s / 1000 for s in samples_ns]
        return {"p50_us": round(percentile(us, 0.5), 1), "p99_us": round(percentile(us, 0.99), 1),
                "p999_us": round(percentile(us, 0.999), 1), "samples": len(us)}
    histogram = HdrHistogram(1, 60_000_000, 3)  # 1 us to 60 s, 3 significant digits
    for sample in samples_ns:
        histogram.record_value(max(1, sample // 1000))
    return {"p50_us": float(histogram.get_value_at_percentile(50)),
            "p99_us": float(histogram.get_value_at_percentile(99)),
            "p999_us": float(histogram.get_value_at_percentile(99.9)), "samples": len(samples_ns)}


# -- child processes ---------------------------------------------------------------------


def bare_server(port: int) -> None:
    ctx: zmq.Context[Any] = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://127.0.0.1:{port}")
    print("READY", flush=True)
    while True:
        frames = sock.recv_multipart()
        if frames[-1] == b"stop":
            return
        sock.send_multipart(frames)


def run_on(loop: str, coro: Any) -> Any:
    """Run ``coro`` on the standard asyncio loop or on uvloop."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def fabric_server(zk: str, name: str, instances: int, loop: str = "asyncio") -> None:
    """``name`` ending in ``-sync``: a sync handler, else an async one."""
    from sdk.direct import DirectClient, Request

    async def echo(request: Request) -> bytes:
        return request.payload

    def echo_sync(request: Request) -> bytes:
        return request.payload

    async def run() -> None:
        client = await DirectClient.connect(zk)
        for _ in range(instances):
            await client.serve(name, echo_sync if name.endswith("-sync") else echo, concurrency=IN_FLIGHT * 2)
        print("READY", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
        await client.close(drain_timeout_ms=1_000)

    run_on(loop, run())


def spawn(*args: str) -> subprocess.Popen[str]:
    with quiet_children():
        proc = subprocess.Popen([sys.executable, "-m", "bench.direct", *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"server {args} did not start: {line!r}")
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        # Interrupted (Ctrl-C), a server that ignores SIGINT may be in the middle of a run
        # and not read its stdin: no 10 s wait then.
        proc.wait(0.1 if sys.exc_info()[0] is not None else 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- measurements ------------------------------------------------------------------------


def bare_figures(requests: int, seconds: float, payload: bytes) -> dict[str, Any]:
    port = free_port()
    server = spawn("--bare-server", str(port))
    ctx: zmq.Context[Any] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        for _ in range(1000):  # warm-up
            sock.send(payload)
            sock.recv()
        samples: list[int] = []
        clock = time.perf_counter_ns
        for _ in range(requests):
            began = clock()
            sock.send(payload)
            sock.recv()
            samples.append(clock() - began)
        done = 0
        for _ in range(IN_FLIGHT):
            sock.send(payload)
        deadline = time.perf_counter() + seconds
        began_s = time.perf_counter()
        while time.perf_counter() < deadline:
            sock.recv()
            done += 1
            sock.send(payload)
        elapsed = time.perf_counter() - began_s
        for _ in range(IN_FLIGHT):
            sock.recv()
        sock.send(b"stop")
        return {**summary_us(samples), "throughput_64_per_s": round(done / elapsed)}
    finally:
        sock.close(linger=0)
        stop(server)


async def bare_asyncio_figures(requests: int, payload: bytes) -> dict[str, Any]:
    """The floor of any asyncio client: zmq.asyncio DEALER, same sync echo server."""
    import zmq.asyncio

    port = free_port()
    server = spawn("--bare-server", str(port))
    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        for _ in range(1000):
            await sock.send(payload)
            await sock.recv()
        samples: list[int] = []
        clock = time.perf_counter_ns
        for _ in range(requests):
            began = clock()
            await sock.send(payload)
            await sock.recv()
            samples.append(clock() - began)
        await sock.send(b"stop")
        return summary_us(samples)
    finally:
        sock.close(linger=0)
        stop(server)


async def direct_async_figures(zk: str, requests: int, seconds: float, payload: bytes,
                               name: str = "echo") -> dict[str, Any]:
    """Latency of sequential requests; throughput with 64 in flight unless ``seconds`` is 0."""
    from sdk.direct import DirectClient

    client = await DirectClient.connect(zk)
    try:
        request = client.request
        for _ in range(1000):
            await request(name, payload)
        samples: list[int] = []
        clock = time.perf_counter_ns
        for _ in range(requests):
            began = clock()
            await request(name, payload)
            samples.append(clock() - began)
        if not seconds:
            return summary_us(samples)
        done = 0
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await request("echo", payload)
                done += 1
        began_s = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(IN_FLIGHT)])
        elapsed = time.perf_counter() - began_s
        return {**summary_us(samples), "throughput_64_per_s": round(done / elapsed)}
    finally:
        await client.close()


def direct_sync_figures(zk: str, requests: int, payload: bytes) -> dict[str, Any]:
    from sdk import Client

    with Client(f"zk://{zk}") as client:
        for _ in range(500):
            client.request("echo", payload)
        samples: list[int] = []
        clock = time.perf_counter_ns
        for _ in range(requests):
            began = clock()
            client.request("echo", payload)
            samples.append(clock() - began)
        return summary_us(samples)


async def gather_figures(zk: str, rounds: int, payload: bytes) -> dict[str, Any]:
    from sdk.direct import DirectClient

    client = await DirectClient.connect(zk)
    try:
        for _ in range(200):
            result = await client.gather("fanout", payload, timeout_ms=2_000)
        if len(result.replies) != GATHER_INSTANCES:
            raise RuntimeError(f"gather saw {len(result.replies)} of {GATHER_INSTANCES} instances")
        samples: list[int] = []
        clock = time.perf_counter_ns
        for _ in range(rounds):
            began = clock()
            result = await client.gather("fanout", payload, timeout_ms=2_000)
            samples.append(clock() - began)
            if len(result.replies) != GATHER_INSTANCES:
                raise RuntimeError(f"gather missed {result.missing}")
        return {**summary_us(samples), "instances": GATHER_INSTANCES}
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.direct", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=positive_int, default=20_000, help="sequential requests per latency run")
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="duration of each 64-in-flight run")
    parser.add_argument("--payload-bytes", type=positive_int, default=100)
    parser.add_argument("--repeats", type=positive_int, default=3, help="whole runs; figures are their medians")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="event loop of the Fabric server and asyncio client")
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--fabric-server", nargs=3, metavar=("ZK", "NAME", "INSTANCES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_server is not None:
        bare_server(args.bare_server)
        return 0
    if args.fabric_server is not None:
        zk, name, instances = args.fabric_server
        fabric_server(zk, name, int(instances), args.loop)
        return 0

    payload = b"x" * args.payload_bytes
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-direct-") as tmp:
        zookeeper = LocalZooKeeper(Path(tmp))
        zookeeper.start()
        try:
            for repeat in range(args.repeats):
                print(f"-- run {repeat + 1} of {args.repeats} (load average {load_average()})", flush=True)
                runs.append(one_run(zookeeper.address, args.requests, args.seconds, payload, args.loop))
        finally:
            zookeeper.stop()
    results = {"bench": "direct", "loop": args.loop, "payload_bytes": args.payload_bytes, "requests": args.requests, "in_flight": IN_FLIGHT,
               "repeats": args.repeats, "load_average_end": load_average(), "runs": runs,
               "median": {key: median_figures([run[key] for run in runs]) for key in runs[0]}}
    medians = results["median"]
    print("medians over the runs (each ratio is taken within its run, then the median):")
    for key in ("bare_pyzmq", "bare_pyzmq_asyncio", "direct_async", "direct_sync", "direct_sync_handler", "gather_8"):
        print(f"  {key:20s}", medians[key])
    print(f"  ratios: {medians['ratios']}")
    print(json_line(results))
    return 0


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def median_figures(figures: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(f[key] for f in figures) for key in figures[0]}


def one_run(zk: str, requests: int, seconds: float, payload: bytes, loop: str = "asyncio") -> dict[str, Any]:
    """Every figure once, the bare baselines first, all against the same machine state."""
    run: dict[str, Any] = {}
    run["bare_pyzmq"] = bare_figures(requests, seconds, payload)
    print("bare pyzmq      ", run["bare_pyzmq"], flush=True)
    run["bare_pyzmq_asyncio"] = asyncio.run(bare_asyncio_figures(requests, payload))
    print("bare zmq.asyncio", run["bare_pyzmq_asyncio"], flush=True)
    server = spawn("--fabric-server", zk, "echo", "1", "--loop", loop)
    try:
        run["direct_async"] = run_on(loop, direct_async_figures(zk, requests, seconds, payload))
        print("fabric (asyncio)", run["direct_async"], flush=True)
        run["direct_sync"] = direct_sync_figures(zk, requests // 2, payload)
        print("fabric (sync)   ", run["direct_sync"], flush=True)
    finally:
        stop(server)
    server = spawn("--fabric-server", zk, "echo-sync", "1", "--loop", loop)
    try:
        run["direct_sync_handler"] = run_on(loop, direct_async_figures(zk, requests // 2, 0, payload, "echo-sync"))
        print("sync handler    ", run["direct_sync_handler"], flush=True)
    finally:
        stop(server)
    fanout = spawn("--fabric-server", zk, "fanout", str(GATHER_INSTANCES), "--loop", loop)
    try:
        run["gather_8"] = run_on(loop, gather_figures(zk, requests // 10, payload))
        print("gather to 8     ", run["gather_8"], flush=True)
    finally:
        stop(fanout)
    bare, direct, sync = run["bare_pyzmq"], run["direct_async"], run["direct_sync"]
    run["ratios"] = {
        "p50_direct_to_bare": round(direct["p50_us"] / bare["p50_us"], 2),
        "p50_sync_to_bare": round(sync["p50_us"] / bare["p50_us"], 2),
        "p50_direct_to_bare_asyncio": round(direct["p50_us"] / run["bare_pyzmq_asyncio"]["p50_us"], 2),
        "throughput_64_direct_to_bare": round(direct["throughput_64_per_s"] / bare["throughput_64_per_s"], 2),
    }
    print(f"p50: fabric asyncio {direct['p50_us']} us, sync {sync['p50_us']} us vs bare pyzmq {bare['p50_us']} us "
          f"(x{run['ratios']['p50_direct_to_bare']}, x{run['ratios']['p50_sync_to_bare']}); "
          f"64 in flight: {direct['throughput_64_per_s']}/s vs {bare['throughput_64_per_s']}/s", flush=True)
    return run


if __name__ == "__main__":
    run(main)

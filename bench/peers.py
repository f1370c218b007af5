"""Fabric side by side with what users would run instead, in one run on this machine.

    python -m bench.peers [--short] [--messages N] [--repeats R] [--systems fabric,nats,redis]
                          [--out DIR] [--replot DIR/peers.json]

Starts every system itself on free loopback ports with temporary dirs (a three-node Fabric
``LocalCluster``, ``nats-server`` with JetStream, ``redis-server`` with AOF) and stops
them all at the end, also on failure or Ctrl-C. For each: durable publish rate and consume
rate of ``--messages`` 100-byte messages through one ordered stream (median of
``--repeats``), end-to-end latency (publish to a consumer in another process) at a fixed
rate, and request-reply round trips of NATS core against a raw pyzmq REQ/REP pair and
Fabric's direct plane. Each system's durability settings are printed beside its figures.

Writes ``peers.json``, ``peers.md`` and two PNG plots into ``--out``; prints the table and,
last, the JSON. ``--short`` is the CI mode: small counts, one repeat.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench._cli import join_or_kill, json_line, positive_float, positive_int, quiet_children, run
from bench._peers import report, request_reply, servers, workloads
from bench.stats import median

SYSTEMS = ("fabric", "nats", "redis")
# Fabric's nodes fsync their write-ahead log once a second, as Redis does with everysec.
FABRIC_FSYNC_INTERVAL_MS = 1_000
FABRIC_NODE_ARGS = ["--fsync", "interval", "--fsync-interval-ms", str(FABRIC_FSYNC_INTERVAL_MS)]
FABRIC_ROWS = (
    ("fabric_rf1", "Fabric RF=1 acks=1", 1, 1),
    ("fabric_rf3", "Fabric RF=3 acks=all", 3, "all"),
)
PROCESS_JOIN_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 60.0

FULL = {"messages": 200_000, "repeats": 3, "e2e_rate_per_s": 5_000, "e2e_seconds": 5.0, "requests": 5_000}
SHORT = {"messages": 5_000, "repeats": 1, "e2e_rate_per_s": 500, "e2e_seconds": 1.0, "requests": 200}


def fabric_durability(replication_factor: int, acks: Any) -> str:
    copies = "one node" if replication_factor == 1 else f"{replication_factor} nodes, min_insync 2"
    return (f"{copies}, acks={acks}: acknowledged once written to RocksDB's WAL (OS page cache) "
            f"on {'the leader' if acks == 1 else 'every in-sync replica'}; WAL fsync every "
            f"{FABRIC_FSYNC_INTERVAL_MS} ms (`--fsync interval`).")


class Runner:
    """Runs the phases with progress bars (on stderr, so stdout stays the report)."""

    def __init__(self, params: dict[str, Any], quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.params = params
        self.console = Console(stderr=True, quiet=quiet)
        self.progress = Progress(TextColumn("{task.description:<38}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=False)

    @contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        task_id = self.progress.add_task(description, total=total)

        def advance(n: int) -> None:
            self.progress.advance(task_id, n)

        try:
            yield advance
        finally:
            self.progress.update(task_id, completed=total)

    def throughput(self, key: str, adapter: Any) -> dict[str, Any]:
        n, publish_runs, consume_runs = self.params["messages"], [], []
        for repeat in range(self.params["repeats"]):
            stream = f"{key}_{repeat}"
            adapter.create(stream)
            with self.task(f"{key} publish {repeat + 1}/{self.params['repeats']}", n) as advance:
                publish_runs.append(n / adapter.publish(stream, n, advance))
            with self.task(f"{key} consume {repeat + 1}/{self.params['repeats']}", n + 1) as advance:
                consume_runs.append((n + 1) / adapter.consume(stream, n, advance))
        return {"publish_msgs_per_s": round(median(publish_runs)), "consume_msgs_per_s": round(median(consume_runs)),
                "publish_runs": [round(r) for r in publish_runs], "consume_runs": [round(r) for r in consume_runs]}

    def end_to_end(self, key: str, spec: workloads.Spec, adapter: Any) -> dict[str, float]:
        rate, seconds = self.params["e2e_rate_per_s"], self.params["e2e_seconds"]
        total = int(rate * seconds)
        stream = f"{key}_e2e"
        adapter.create(stream)
        ctx = multiprocessing.get_context("spawn")
        ready, results = ctx.Event(), ctx.Queue()
        consumer = ctx.Process(target=workloads.e2e_consumer_process,
                               args=(spec, stream, total, seconds + 30, ready, results), daemon=True)
        with quiet_children():
            consumer.start()
        try:
            if not ready.wait(READY_TIMEOUT_S):
                raise RuntimeError(f"{key}: the end-to-end consumer did not start within {READY_TIMEOUT_S} s")
            with self.task(f"{key} end to end at {rate:,}/s", total) as advance:
                adapter.publish_paced(stream, total, rate, advance)
            latencies_ns = results.get(timeout=seconds + 60)
        finally:
            join_or_kill([consumer], PROCESS_JOIN_TIMEOUT_S)
        if len(latencies_ns) != total:
            raise workloads.Incomplete(f"{key}: the end-to-end consumer saw {len(latencies_ns)} of {total} messages")
        return report.latency_summary(latencies_ns)

    def request_reply(self, key: str, responder: Callable[..., None], responder_arg: str,
                      requester: Callable[[str, int, Callable[[int], None]], list[int]]) -> dict[str, float]:
        ctx = multiprocessing.get_context("spawn")
        ready, stop = ctx.Event(), ctx.Event()
        process = ctx.Process(target=responder, args=(responder_arg, ready, stop), daemon=True)
        with quiet_children():
            process.start()
        try:
            if not ready.wait(READY_TIMEOUT_S):
                raise RuntimeError(f"{key}: the responder did not start within {READY_TIMEOUT_S} s")
            count = self.params["requests"]
            with self.task(f"{key} request-reply", count) as advance:
                latencies_ns = requester(responder_arg, count, advance)
        finally:
            stop.set()
            process.join(timeout=PROCESS_JOIN_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join(timeout=PROCESS_JOIN_TIMEOUT_S)
        return report.latency_summary(latencies_ns)


def _row(label: str, durability: str) -> dict[str, Any]:
    return {"label": label, "durability": durability, "status": "ok"}


def run_fabric(runner: Runner, base: Path, rows: dict[str, dict[str, Any]], rr: dict[str, dict[str, Any]],
               partitions: int) -> None:
    from fabric.local import LocalCluster

    missing = request_reply.direct_plane_missing()
    rr["fabric_direct"] = {"label": "Fabric direct plane", "status": missing or "ok"}
    with LocalCluster(3, base / "fabric", node_args=FABRIC_NODE_ARGS) as cluster:
        if missing is None:
            try:
                rr["fabric_direct"]["latency"] = runner.request_reply(
                    "fabric direct", request_reply.direct_responder, cluster.zk_address,
                    request_reply.direct_requests)
            except Exception as exc:
                rr["fabric_direct"]["status"] = f"error: {exc}"
        for key, label, replication_factor, acks in FABRIC_ROWS:
            rows[key] = _row(label, fabric_durability(replication_factor, acks))
            spec = {"system": "fabric", "bootstrap": cluster.bootstrap, "acks": acks,
                    "replication_factor": replication_factor, "partitions": partitions}
            adapter = workloads.make(spec)
            try:
                rows[key].update(runner.throughput(key, adapter))
                rows[key]["e2e"] = runner.end_to_end(key, spec, adapter)
            except Exception as exc:
                rows[key]["status"] = f"error: {exc}"


def run_nats(runner: Runner, base: Path, rows: dict[str, dict[str, Any]], rr: dict[str, dict[str, Any]]) -> None:
    rows["nats"] = _row("NATS JetStream", servers.DURABILITY["nats"])
    rr["nats_core"] = {"label": "NATS core request/reply", "status": "ok"}
    with servers.NatsServer(base) as server:
        assert isinstance(server, servers.NatsServer)
        spec = {"system": "nats", "url": server.url}
        adapter = workloads.make(spec)
        try:
            rows["nats"].update(runner.throughput("nats", adapter))
            rows["nats"]["e2e"] = runner.end_to_end("nats", spec, adapter)
        except Exception as exc:
            rows["nats"]["status"] = f"error: {exc}"
        try:
            rr["nats_core"]["latency"] = runner.request_reply("nats core", request_reply.nats_responder, server.url,
                                                              request_reply.nats_requests)
        except Exception as exc:
            rr["nats_core"]["status"] = f"error: {exc}"


def run_redis(runner: Runner, base: Path, rows: dict[str, dict[str, Any]]) -> None:
    rows["redis"] = _row("Redis Streams", servers.DURABILITY["redis"])
    with servers.RedisServer(base) as server:
        spec = {"system": "redis", "port": server.port}
        adapter = workloads.make(spec)
        try:
            rows["redis"].update(runner.throughput("redis", adapter))
            rows["redis"]["e2e"] = runner.end_to_end("redis", spec, adapter)
        except Exception as exc:
            rows["redis"]["status"] = f"error: {exc}"


def run_zmq_baseline(runner: Runner, rr: dict[str, dict[str, Any]]) -> None:
    from fabric.local import free_port

    rr["zmq_raw"] = {"label": "raw pyzmq REQ/REP (floor)", "status": "ok"}
    try:
        rr["zmq_raw"]["latency"] = runner.request_reply("pyzmq", request_reply.zmq_responder,
                                                        f"tcp://127.0.0.1:{free_port()}", request_reply.zmq_requests)
    except Exception as exc:
        rr["zmq_raw"]["status"] = f"error: {exc}"


def write_outputs(figures: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "peers.json").write_text(json.dumps(figures, indent=1) + "\n")
    (out_dir / "peers.md").write_text(report.markdown(figures))
    return [out_dir / "peers.json", out_dir / "peers.md", *report.plots(figures, out_dir)]


def main(argv: list[str] | None = None, prog: str = "python -m bench.peers") -> int:
    """``prog``: how errors and --help name the command (``fabric bench --peers`` passes its own)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="CI mode: small counts, one repeat")
    parser.add_argument("--messages", type=positive_int, help=f"messages per publish run (default {FULL['messages']:,})")
    parser.add_argument("--repeats", type=positive_int, help=f"publish+consume runs per system (default {FULL['repeats']})")
    parser.add_argument("--e2e-rate", type=positive_int, dest="e2e_rate_per_s", help="messages per second in the e2e phase")
    parser.add_argument("--e2e-seconds", type=positive_float, help="length of the e2e phase")
    parser.add_argument("--requests", type=positive_int, help="sequential request-reply round trips")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument("--fabric-partitions", type=positive_int, default=1,
                        help="partitions of Fabric's topic (default 1: one ordered stream, like the others)")
    parser.add_argument("--out", default="peers-results", help="directory for peers.json, peers.md and the PNGs")
    parser.add_argument("--replot", metavar="JSON", help="redraw table and plots from a saved peers.json; no run")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    out_dir = Path(args.out)
    if args.replot:
        try:
            saved = json.loads(Path(args.replot).read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"argument --replot: cannot read {args.replot}: {exc}")
        for path in write_outputs(saved, out_dir):
            print(f"wrote {path}")
        return 0
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    params = dict(SHORT if args.short else FULL)
    for name in params:
        if getattr(args, name, None) is not None:
            params[name] = getattr(args, name)

    figures: dict[str, Any] = {
        "bench": "peers", "mode": "short" if args.short else "full", **params,
        "message_bytes": workloads.VALUE_BYTES, "fabric_partitions": args.fabric_partitions,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "systems": {}, "request_reply": {},
    }
    rows: dict[str, dict[str, Any]] = figures["systems"]
    rr: dict[str, dict[str, Any]] = figures["request_reply"]
    runner = Runner(params, quiet=args.quiet)
    with tempfile.TemporaryDirectory(prefix="fabric-peers-") as tmp, ExitStack() as stack:
        stack.enter_context(runner.progress)
        base = Path(tmp)
        for system in systems:
            missing = servers.binary_missing(system)
            if missing:
                rows[system] = {"label": system, "status": f"skipped: {missing}"}
                continue
            runner.console.log(f"[bold]{system}[/bold]")
            if system == "fabric":
                run_fabric(runner, base, rows, rr, args.fabric_partitions)
            elif system == "nats":
                run_nats(runner, base, rows, rr)
            elif system == "redis":
                run_redis(runner, base, rows)
        run_zmq_baseline(runner, rr)
    written = write_outputs(figures, out_dir)
    print(report.markdown(figures))
    print("\n".join(f"wrote {path}" for path in written))
    print(json_line(figures))
    failed = [key for key, row in {**rows, **rr}.items() if str(row["status"]).startswith("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    run(main)

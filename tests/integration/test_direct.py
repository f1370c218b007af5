"""The direct plane against real ZooKeeper and real service processes (SIGKILL and
SIGSTOP are real). Each test has its own ZooKeeper chroot."""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk
from fabric import errors
from fabric.local import LocalZooKeeper, ManagedProcess
from fabric.protocol import direct as wire
from sdk.direct import DirectClient, Message

ROOT = Path(__file__).parents[2]
READY_TIMEOUT_S = 30.0


@pytest.fixture
def zk_hosts(zk_server: LocalZooKeeper) -> str:
    return f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"


class Instance:
    """One service instance process and the file where it logs every handler run."""

    def __init__(self, base: Path, zk: str, name: str, index: int) -> None:
        self.handled_path = base / f"{name}-{index}.handled"
        self.process = ManagedProcess(
            f"{name}-{index}",
            [sys.executable, "-m", "tests.integration.direct_service", zk, name, str(self.handled_path)],
            base / f"{name}-{index}.log",
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.znode = ""

    def start(self) -> Instance:
        self.process.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.process.log_tail(50).splitlines():
                if line.startswith("READY "):
                    self.znode = line.split()[2].rsplit("/", 1)[1]
                    return self
            if not self.process.running:
                break
            time.sleep(0.02)
        raise RuntimeError(f"instance did not start:\n{self.process.log_tail()}")

    def handled(self) -> list[str]:
        try:
            return self.handled_path.read_text().split()
        except FileNotFoundError:
            return []


@pytest.fixture
def instances(tmp_path: Path, zk_hosts: str) -> Iterator[list[Instance]]:
    started: list[Instance] = []
    yield started
    for instance in started:
        instance.process.stop()


def start_instances(started: list[Instance], base: Path, zk: str, name: str, count: int) -> list[Instance]:
    new = [Instance(base, zk, name, len(started) + i) for i in range(count)]
    started.extend(new)  # before start(): the fixture stops them even if one fails to start
    for instance in new:
        instance.start()
    return new


def test_failover_kill_pause_and_a_new_instance(instances: list[Instance], tmp_path: Path, zk_hosts: str) -> None:
    """Three instances under load; one SIGKILLed, one SIGSTOPped, one added. Idempotent
    requests all complete; non-idempotent ones complete or fail typed and never run twice;
    the new instance takes traffic within 1 s of registering."""
    a, b, c = start_instances(instances, tmp_path, zk_hosts, "orders", 3)
    outcomes: dict[str, str] = {}
    new_instance: list[Instance] = []

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        stop = asyncio.Event()
        ids = iter(range(10**9))

        async def worker(idempotent: bool) -> None:
            while not stop.is_set():
                rid = f"{'i' if idempotent else 'n'}{next(ids)}"
                try:
                    reply = await client.request("orders", f"run:{rid}", timeout_ms=4_000, idempotent=idempotent)
                    assert reply.payload.decode().startswith(f"{rid}@")
                    outcomes[rid] = "ok"
                except (errors.RequestTimeout, errors.NoServiceAvailable) as exc:
                    outcomes[rid] = type(exc).__name__
                    if idempotent:
                        raise
        try:
            workers = [asyncio.ensure_future(worker(i % 2 == 0)) for i in range(16)]
            await asyncio.sleep(0.5)
            a.process.kill()
            await asyncio.sleep(0.3)
            b.process.pause()
            await asyncio.sleep(1.5)  # b is detected by heartbeats, long before its session expires
            assert client.instances("orders")[b.znode] == "dead"
            new_instance.extend(start_instances(instances, tmp_path, zk_hosts, "orders", 1))
            await asyncio.sleep(1.5)
            stop.set()
            await asyncio.gather(*workers)
        finally:
            await client.close()

    asyncio.run(run())
    b.process.resume()
    time.sleep(0.5)  # let the resumed instance run what was queued to it: it must run once, not twice
    d = new_instance[0]
    runs = collections.Counter(rid for inst in (a, b, c, d) for rid in inst.handled())
    idempotent_ids = [r for r in outcomes if r.startswith("i")]
    plain_ids = [r for r in outcomes if r.startswith("n")]
    assert idempotent_ids and plain_ids
    assert all(outcomes[r] == "ok" for r in idempotent_ids)
    assert all(runs[r] == 1 for r in plain_ids if outcomes[r] == "ok")
    assert all(runs[r] <= 1 for r in plain_ids), "a non-idempotent request ran twice"
    assert sum(outcomes[r] == "ok" for r in plain_ids) > len(plain_ids) // 2
    assert d.handled(), "the new instance took no traffic"


def test_blocking_client_threads_ride_over_a_paused_instance(instances: list[Instance], tmp_path: Path,
                                                             zk_hosts: str) -> None:
    """The blocking API's requests run on the callers' own threads (sdk.direct._blocking):
    several threads at once, an instance SIGSTOPped meanwhile, idempotent calls all
    complete, each exactly answered."""
    _a, b = start_instances(instances, tmp_path, zk_hosts, "ledger", 2)
    replies: dict[str, str] = {}
    with sdk.Client(f"zk://{zk_hosts}") as client:
        client.gather("ledger", "run:warm", timeout_ms=5_000, min_replies=2)

        def worker(thread: int) -> None:
            for n in range(40):
                rid = f"t{thread}-{n}"
                reply = client.request("ledger", f"run:{rid}", timeout_ms=4_000, idempotent=True)
                replies[rid] = reply.payload.decode()
                time.sleep(0.01)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.15)
        b.process.pause()
        try:
            for thread in threads:
                thread.join(60)
        finally:
            b.process.resume()
    assert len(replies) == 160
    assert all(reply.startswith(f"{rid}@") for rid, reply in replies.items())


def test_blocking_attempt_on_an_instance_closed_after_the_pick_moves_on(instances: list[Instance], tmp_path: Path,
                                                                       zk_hosts: str) -> None:
    """A blocking caller reads the ready list off the loop; the loop may close the instance it
    picked (gone from the registry, nothing counted in flight yet) before the attempt is
    counted. Nobody pings a closed instance, so its silence never shows: the attempt must see
    the closure, not wait out its share of the timeout (it did, once, in a chaos run)."""
    a, _b = start_instances(instances, tmp_path, zk_hosts, "ledger", 2)
    with sdk.Client(f"zk://{zk_hosts}") as client:
        client.gather("ledger", "run:warm", timeout_ms=5_000, min_replies=2)
        sync = client.direct
        view = sync.direct._views["ledger"]
        peer = next(p for p in view.ready if p.znode == a.znode)
        a.process.kill()

        async def close_it() -> None:  # as the heartbeat loop closes a peer that left
            del view.peers[peer.znode]
            peer.close()
            view.refresh()
        sync._loop.run(close_it(), 5.0)
        frames = wire.request_frames(1, b"run:late", timeout_ms=3_000, idempotent=True)
        outcome = sync._blocking._attempt(view, peer, 1, frames, 3.0)  # before: "no reply ... in time" after 3 s
        assert outcome == (f"instance {a.znode} left the registry", True)
        reply = client.request("ledger", "run:after", timeout_ms=5_000, idempotent=True)
        assert reply.payload.startswith(b"after@")


def test_new_instance_used_within_one_second(instances: list[Instance], tmp_path: Path, zk_hosts: str) -> None:
    start_instances(instances, tmp_path, zk_hosts, "pricing", 1)

    async def run() -> float:
        client = await DirectClient.connect(zk_hosts)
        try:
            await client.request("pricing", "run:warm", timeout_ms=2_000)
            stop = asyncio.Event()
            seen: dict[str, float] = {}

            async def load() -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    reply = await client.request("pricing", f"slow:5:x{n}", timeout_ms=2_000)
                    seen.setdefault(reply.instance, time.monotonic())
            workers = [asyncio.ensure_future(load()) for _ in range(4)]
            # Start the new instance; it is registered when READY is printed.
            new = await asyncio.to_thread(start_instances, instances, tmp_path, zk_hosts, "pricing", 1)
            registered = time.monotonic()
            for _ in range(100):
                if new[0].znode in seen:
                    break
                await asyncio.sleep(0.02)
            stop.set()
            await asyncio.gather(*workers)
            return seen.get(new[0].znode, float("inf")) - registered
        finally:
            await client.close()

    assert asyncio.run(run()) < 1.0


def test_handler_errors_come_back_typed(instances: list[Instance], tmp_path: Path, zk_hosts: str) -> None:
    start_instances(instances, tmp_path, zk_hosts, "calc", 1)

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            with pytest.raises(errors.RemoteError) as caught:
                await client.request("calc", "raise:division by zero", timeout_ms=2_000)
            assert caught.value.remote_type == "ValueError"  # type: ignore[attr-defined]
            assert caught.value.remote_message == "division by zero"  # type: ignore[attr-defined]
            # The instance keeps serving after a handler error.
            assert (await client.request("calc", "run:after", timeout_ms=2_000)).payload.startswith(b"after@")
            with pytest.raises(errors.NoServiceAvailable):
                await client.request("nobody-serves-this", "x", timeout_ms=500)
        finally:
            await client.close()

    asyncio.run(run())


def test_gather_with_one_instance_paused(instances: list[Instance], tmp_path: Path, zk_hosts: str) -> None:
    started = start_instances(instances, tmp_path, zk_hosts, "inventory", 3)

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            first = await client.gather("inventory", "run:g0", timeout_ms=2_000)
            assert len(first.replies) == 3 and not first.missing
            started[1].process.pause()
            began = time.monotonic()
            result = await client.gather("inventory", "run:g1", timeout_ms=1_000)
            elapsed = time.monotonic() - began
            assert sorted(r.instance for r in result.replies) == sorted([started[0].znode, started[2].znode])
            assert result.missing == [started[1].znode]
            assert elapsed < 3.0  # the timeout bounds it; generous for a loaded machine
            with pytest.raises(errors.RequestTimeout):
                await client.gather("inventory", "run:g2", timeout_ms=500, min_replies=3)
        finally:
            started[1].process.resume()
            await client.close()

    asyncio.run(run())


def test_graceful_stop_drains_in_flight(instances: list[Instance], tmp_path: Path, zk_hosts: str) -> None:
    """SIGTERM: the instance deregisters, finishes what it runs, and callers lose nothing."""
    one, _two = start_instances(instances, tmp_path, zk_hosts, "billing", 2)

    async def run() -> list[str]:
        client = await DirectClient.connect(zk_hosts)
        try:
            await client.gather("billing", "run:warm", timeout_ms=2_000)
            calls = [asyncio.ensure_future(client.request("billing", f"slow:300:s{n}", timeout_ms=5_000))
                     for n in range(20)]
            await asyncio.sleep(0.1)
            one.process.signal(15)
            replies = await asyncio.gather(*calls)
            return [r.payload.decode() for r in replies]
        finally:
            await client.close()

    replies = asyncio.run(run())
    assert sorted(r.split("@")[0] for r in replies) == sorted(f"s{n}" for n in range(20))


def test_pubsub_wildcards(zk_hosts: str) -> None:
    async def run() -> dict[str, list[str]]:
        publisher = await DirectClient.connect(zk_hosts)
        subscriber = await DirectClient.connect(zk_hosts)
        try:
            subs = {p: await subscriber.subscribe(p) for p in ("orders.*", "orders.>", "orders.*.paid", ">")}
            await publisher.publish("warmup", b"")
            deadline = time.monotonic() + 10
            while any(s.publishers == 0 for s in subs.values()) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # TCP connects of the SUB sockets (slow joiner)
            for subject in ("orders.new", "orders.eu.paid", "orders.us.paid", "orders.eu.paid.late", "billing.x",
                            "orders"):
                await publisher.publish(subject, subject.encode(), headers={"h": "1"})
            out: dict[str, list[str]] = {}
            for pattern, sub in subs.items():
                got: list[str] = []
                while True:
                    message = await sub.next(500)
                    if message is None:
                        break
                    if message.subject == "warmup":
                        continue
                    assert message.headers == {"h": b"1"}
                    got.append(message.subject)
                out[pattern] = got
            return out
        finally:
            await subscriber.close()
            await publisher.close()

    got = asyncio.run(run())
    assert got["orders.*"] == ["orders.new"]
    assert got["orders.>"] == ["orders.new", "orders.eu.paid", "orders.us.paid", "orders.eu.paid.late"]
    assert got["orders.*.paid"] == ["orders.eu.paid", "orders.us.paid"]
    assert got[">"] == ["orders.new", "orders.eu.paid", "orders.us.paid", "orders.eu.paid.late", "billing.x", "orders"]


def test_own_publishes_reach_own_subscriptions_once_and_at_once(zk_hosts: str) -> None:
    """As a NATS connection sees its own publishes: in process, from the first message on
    (no wait for the SUB socket to find the publisher), and once, though the client's
    publisher is registered in ZooKeeper like any other. Another client still gets them
    over the network."""
    async def run() -> tuple[list[int], list[int], int, int]:
        client = await DirectClient.connect(zk_hosts)
        other = await DirectClient.connect(zk_hosts)
        try:
            own = await client.subscribe("echo.>")
            remote = await other.subscribe("echo.>")
            for n in range(100):  # the first publish starts the publisher: nothing waits
                await client.publish(f"echo.{n}", str(n).encode())
            mine = [int((await own.next(1_000) or Message("", b"-1", {}, 0, 0)).payload) for _ in range(100)]
            deadline = time.monotonic() + 10
            while remote.publishers == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # the other client's SUB connects (slow joiner)
            for n in range(100, 110):
                await client.publish(f"echo.{n}", str(n).encode())
            await asyncio.sleep(0.5)
            while (message := await own.next(0)) is not None:
                mine.append(int(message.payload))
            theirs = []
            while (message := await remote.next(200)) is not None:
                theirs.append(int(message.payload))
            return mine, theirs, own.publishers, own.gaps
        finally:
            await other.close()
            await client.close()

    mine, theirs, own_publishers, own_gaps = asyncio.run(run())
    assert mine == list(range(110))  # every one, once, in order
    assert own_gaps == 0 and own_publishers == 0  # never connected to its own PUB socket
    assert theirs[-10:] == list(range(100, 110))


def test_slow_subscriber_drops_and_never_blocks_the_publisher(zk_hosts: str) -> None:
    published = 50_000

    async def run() -> tuple[int, int, int, int]:
        publisher = await DirectClient.connect(zk_hosts)
        subscriber = await DirectClient.connect(zk_hosts)
        handled: list[int] = []

        def slow(message: Message) -> None:
            time.sleep(0.002)
            handled.append(message.sequence)

        try:
            sub = await subscriber.subscribe("ticks.>", slow, pending_max=100)
            while sub.received == 0:
                await publisher.publish("ticks.warm", b"")
                await asyncio.sleep(0.05)
            for _n in range(published):
                await publisher.publish("ticks.a", b"x" * 100)
            handled_when_done = len(handled)
            # Losses at the tail show as a gap once a later message of the same subject
            # arrives (sequences are per subject).
            deadline = time.monotonic() + 10
            while sub.received + sub.gaps <= published and time.monotonic() < deadline:
                await publisher.publish("ticks.a", b"")
                await asyncio.sleep(0.1)
            return handled_when_done, sub.received, sub.dropped, sub.gaps
        finally:
            await subscriber.close()
            await publisher.close()

    handled_when_done, received, dropped, gaps = asyncio.run(run())
    # The publisher finished long before the subscriber could handle its messages.
    assert handled_when_done < published // 4
    # Every message is either received or counted as a gap; received ones beyond the
    # queue bound were dropped and counted.
    assert dropped > 0
    assert received + gaps >= published + 1



def run_cli(*argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric", *argv], capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)


def test_cli_service_list_request_and_subscribe(instances: list[Instance], tmp_path: Path, zk_hosts: str) -> None:
    (one,) = start_instances(instances, tmp_path, zk_hosts, "greeter", 1)
    bootstrap = f"zk://{zk_hosts}"
    listing = run_cli("service", "list", "--bootstrap", bootstrap)
    assert listing.returncode == 0, listing.stderr
    assert "greeter" in listing.stdout and one.znode in listing.stdout
    named = run_cli("service", "list", "greeter", "--bootstrap", bootstrap)
    assert named.returncode == 0 and one.znode in named.stdout, named.stderr
    for extra in ([], ["--json"]):  # a health check's answer: nothing of that name is up
        unknown = run_cli("service", "list", "nobody", *extra, "--bootstrap", bootstrap)
        assert unknown.returncode == 1 and "Traceback" not in unknown.stderr, unknown.stderr
    assert "no instance of service 'nobody'" in run_cli("service", "list", "nobody", "--bootstrap", bootstrap).stdout
    reply = run_cli("request", "greeter", "run:cli", "--bootstrap", bootstrap, "--idempotent")
    assert reply.returncode == 0, reply.stderr
    assert reply.stdout.startswith("cli@")
    failed = run_cli("request", "greeter", "raise:nope", "--bootstrap", bootstrap)
    assert failed.returncode == 1 and "REMOTE_ERROR" in failed.stderr and "ValueError" in failed.stderr
    assert "Traceback" not in failed.stderr
    missing = run_cli("request", "nobody", "x", "--bootstrap", bootstrap, "--timeout-ms", "500")
    assert missing.returncode == 1 and "NO_SERVICE_AVAILABLE" in missing.stderr

    subscriber = subprocess.Popen(
        [sys.executable, "-m", "fabric", "subscribe", "news.>", "--bootstrap", bootstrap, "--max-messages", "1",
         "--timeout-ms", "20000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 30
        output = ""
        while time.monotonic() < deadline and subscriber.poll() is None:
            published = run_cli("publish", "news.eu", "hello", "--bootstrap", bootstrap, "--wait-ms", "700")
            assert published.returncode == 0, published.stderr
            try:
                output, _ = subscriber.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
        assert output == "news.eu\thello\n"
    finally:
        subscriber.kill()
        subscriber.wait()

"""Regressions found auditing the direct plane against its documents (docs/DIRECT.md,
docs/PROTOCOL.md section 10): what an outside reviewer would try first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from kazoo.client import KazooClient

import sdk
import sdk.direct
from fabric import errors
from fabric.local import LocalZooKeeper
from sdk.direct import DirectClient, Request, _peers


@pytest.fixture
def zk_hosts(zk_server: LocalZooKeeper) -> str:
    return f"{zk_server.address}/direct-audit-{uuid.uuid4().hex[:10]}"


async def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.02)


def test_other_subjects_are_not_counted_as_gaps(zk_hosts: str) -> None:
    """A publisher of several subjects: a subscription that matches one of them lost
    nothing, so it must count no gap (sequences were per publisher: every message of
    another subject showed as lost, remotely and in process alike)."""

    async def run() -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        publisher = await DirectClient.connect(zk_hosts)
        subscriber = await DirectClient.connect(zk_hosts)
        try:
            await publisher.start_publisher()
            remote = await subscriber.subscribe("orders.*.paid")
            local = await publisher.subscribe("orders.*.paid")
            await _wait_for(lambda: remote.publishers == 1)
            await asyncio.sleep(0.3)  # the TCP connection (slow joiner)
            for i in range(5):
                await publisher.publish("orders.eu.paid", b"%d" % i)
                await publisher.publish("orders.eu.shipped", b"x")  # same ZeroMQ prefix, no match
                await publisher.publish("users.created", b"x")  # filtered by the PUB socket
            await _wait_for(lambda: remote.received == 5, 5.0)
            return (remote.received, remote.gaps, remote.lost), (local.received, local.gaps, local.lost)
        finally:
            await subscriber.close()
            await publisher.close()

    remote, local = asyncio.run(run())
    assert remote == (5, 0, 0)
    assert local == (5, 0, 0)


def test_a_reply_with_str_payload_and_headers_is_sent_whole(zk_hosts: str) -> None:
    """DIRECT.md: a handler returns bytes, str, None or sdk.Reply(payload, headers). A str
    inside a Reply failed half-way through the send, left half a message on the ROUTER and
    corrupted the next reply (the caller saw MALFORMED_REQUEST or a timeout)."""

    async def handler(request: Request) -> sdk.Reply | bytes:
        if request.payload == b"str":
            return sdk.Reply("text", {"trace": "abc"})
        if request.payload == b"bad":
            return sdk.Reply(b"x", {"n": 5})  # type: ignore[dict-item]
        return b"ok"

    async def run() -> list[object]:
        client = await DirectClient.connect(zk_hosts)
        try:
            await client.serve("replies", handler)
            out: list[object] = []
            for payload in (b"str", b"bad", b"plain"):
                try:
                    reply = await client.request("replies", payload, timeout_ms=2_000)
                    out.append((reply.payload, reply.headers))
                except errors.FabricError as exc:
                    out.append(type(exc).__name__)
            return out
        finally:
            await client.close()

    got = asyncio.run(run())
    assert got[0] == (b"text", {"trace": b"abc"})
    assert got[1] == "InvalidRequestError"  # the handler's result was unsendable: said so, typed
    assert got[2] == (b"ok", {})  # and the connection still carries whole messages


def test_blocking_client_after_close_and_its_twins(zk_hosts: str) -> None:
    """The blocking sdk.Client: the subscription and service twins have what the docs use
    (``sub.publishers``, iteration, counters), and calls after close() fail with
    ClientClosedError, not "Event loop is closed"; close() may be called twice."""
    client = sdk.Client(f"zk://{zk_hosts}")
    try:
        service = client.serve("twin", lambda request: request.payload)
        assert client.request("twin", b"hi", timeout_ms=2_000).payload == b"hi"
        assert service.handled == 1 and service.failed == 0 and service.callers >= 0
        client.start_publisher()
        sub = client.subscribe("twin.>")
        assert sub.publishers == 0  # its own publisher is delivered in process
        client.publish("twin.a", b"1")
        client.publish("twin.b", b"2")
        assert sub.next(0) is not None  # 0: what is queued already
        assert sub.next(None) is not None  # None: wait for the next one
        assert sub.gaps == 0 and sub.refused == 0 and sub.handler_errors == 0
        client.publish("twin.c", b"3")
        sub.close()
        assert [m.payload for m in sub] == [b"3"]  # what was queued, then the end
    finally:
        client.close()
    client.close()  # twice: nothing to do
    service.stop()  # stopped by the client's close already
    assert sub.next(100) is None
    for call in (lambda: client.gather("twin", b"x", timeout_ms=100), lambda: client.publish("twin.a", b"x"),
                 lambda: client.subscribe("twin.>"), lambda: client.serve("twin", lambda r: b""),
                 lambda: client.request("twin", b"x", timeout_ms=100)):
        with pytest.raises(errors.ClientClosedError):
            call()


def test_bad_arguments_are_named_before_anything_runs(zk_hosts: str) -> None:
    with sdk.Client(f"zk://{zk_hosts}") as client:
        for call, text in [
            (lambda: client.request("x", b"", timeout_ms="100"), "timeout_ms"),
            (lambda: client.gather("x", b"", timeout_ms=None), "timeout_ms"),
            (lambda: client.request("x", b"", headers=[("a", "b")]), "headers"),
            (lambda: client.request("x", b"", attempts_max=2.5), "attempts_max"),
            (lambda: client.serve("x", None), "handler"),
            (lambda: client.serve("x", lambda r: b"", concurrency="4"), "concurrency"),
            (lambda: client.subscribe("x.y", pending_max="5"), "pending_max"),
            (lambda: client.subscribe("x.y", "not a handler"), "handler"),
            (lambda: client.request("x", 123), "payload"),  # was InvalidRequestError, against the rule
            (lambda: client.gather("x", 1.5), "payload"),
            (lambda: client.publish("x.y", 7), "payload"),
            (lambda: client.request("x", b"", headers={"h": 5}), "header 'h'"),
        ]:
            with pytest.raises(TypeError, match=text):
                call()
        with pytest.raises(errors.InvalidRequestError, match="queue_max"):
            client.serve("x", lambda r: b"", queue_max=-1)
        assert client.services() == {}  # nothing was registered by the refused calls


_HEADER = struct.Struct("<IBBBBII")


def _header(type_: int, cid: int, flags: int = 0, aux: int = 0) -> bytes:
    return _HEADER.pack(0x31444246, 1, type_, flags, 0, cid, aux)


# A raw instance's handler: (identity, (type, flags, correlation id, aux), frames after the
# header) -> the messages to send back, each without the identity frame.
_RawHandler = Callable[[bytes, tuple[int, int, int, int], list[bytes]], list[list[bytes]]]


@contextlib.contextmanager
def _raw_instance(zk_server: LocalZooKeeper, zk_hosts: str, service: str, handle: _RawHandler) -> Iterator[None]:
    """A bare ROUTER registered by hand as an instance of ``service`` (docs/PROTOCOL.md 10.3),
    served by ``handle`` on a thread; stopped, closed and unregistered on exit."""
    admin = KazooClient(zk_server.address)
    admin.start()
    admin.ensure_path(zk_hosts[len(zk_server.address):])
    admin.stop()
    admin.close()
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve() -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while not stop.is_set():
            if poller.poll(50):
                identity, header, *rest = router.recv_multipart()
                _magic, _version, type_, flags, _reserved, cid, aux = _HEADER.unpack(header)
                for message in handle(identity, (type_, flags, cid, aux), rest):
                    router.send_multipart([identity, *message])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    zk = KazooClient(zk_hosts)
    zk.start()
    try:
        zk.create(f"/fabric/services/{service}/instance-", json.dumps({"address": f"tcp://127.0.0.1:{port}"}).encode(),
                  ephemeral=True, sequence=True, makepath=True)
        yield
    finally:
        zk.stop()
        zk.close()
        stop.set()
        thread.join(5)
        router.close()


def test_raw_pyzmq_peers_written_from_protocol_md(zk_server: LocalZooKeeper, zk_hosts: str) -> None:
    """docs/PROTOCOL.md section 10 alone: a raw ROUTER instance registered by hand serves
    SDK callers; a raw DEALER caller (no PINGs) and a raw SUB subscriber use SDK peers."""
    ctx = zmq.Context.instance()

    def handle(_identity: bytes, header: tuple[int, int, int, int], rest: list[bytes]) -> list[list[bytes]]:
        type_, _flags, cid, _aux = header
        if type_ == 4:  # PING -> PONG, load 0
            return [[_header(5, 0)]]
        if type_ == 1:  # REQUEST -> REPLY
            return [[_header(2, cid), b"raw:" + rest[0]]]
        return []

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            reply = await client.request("raw", b"hello", timeout_ms=3_000)
            assert reply.payload == b"raw:hello"
            gathered = await client.gather("raw", b"g", timeout_ms=1_000)
            assert [r.payload for r in gathered.replies] == [b"raw:g"] and not gathered.missing

            service = await client.serve("sdk", lambda r: r.payload + b"|" + r.headers.get("trace", b"-"))
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(service.address)
            headers = struct.pack("<H", 1) + bytes([5]) + b"trace" + struct.pack("<I", 2) + b"\x01\x02"
            dealer.send_multipart([_header(1, 7, flags=3, aux=1500), b"hello", headers])
            loop = asyncio.get_running_loop()
            answer = await asyncio.wait_for(loop.run_in_executor(None, dealer.recv_multipart), 5)
            assert answer == [_header(2, 7), b"hello|\x01\x02"]
            dealer.send_multipart([_header(1, 8, aux=0), b"no deadline"])  # aux 0: no timeout
            answer = await asyncio.wait_for(loop.run_in_executor(None, dealer.recv_multipart), 5)
            assert answer == [_header(2, 8), b"no deadline|-"]
            dealer.close()

            publisher = await client.start_publisher()
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"raw.")
            sub.connect(publisher.address)
            await asyncio.sleep(0.3)
            await client.publish("raw.a", b"1")
            await client.publish("raw.a", b"2")
            first = await asyncio.wait_for(loop.run_in_executor(None, sub.recv_multipart), 5)
            second = await asyncio.wait_for(loop.run_in_executor(None, sub.recv_multipart), 5)
            assert first[0] == b"raw.a" and second[2] == b"2"
            assert _HEADER.unpack(second[1])[5] == _HEADER.unpack(first[1])[5] + 1  # numbered per subject
            sub.close()
        finally:
            await client.close()

    with _raw_instance(zk_server, zk_hosts, "raw", handle):
        asyncio.run(run())


def test_an_instance_that_never_answers_a_ping_drops_out_of_gathers(zk_server: LocalZooKeeper, zk_hosts: str) -> None:
    """Found writing a service from PROTOCOL.md 10.3 alone: an instance registered but
    answering no PING stayed "connecting" for ever, and every gather sent it a REQUEST;
    a gather's requests also carried its whole timeout_ms after it had waited for a
    first PONG. Now it is marked dead once its first PINGs go unanswered (4 intervals),
    gathers list it missing without asking it, and what they send is the time left."""
    requests: list[int] = []  # each REQUEST's aux (its timeout), as it arrived
    speaks = threading.Event()  # unset: answers nothing; set: a caller's first PONG comes 0.5 s after its first PING
    first_ping_s: dict[bytes, float] = {}

    def handle(identity: bytes, header: tuple[int, int, int, int], _rest: list[bytes]) -> list[list[bytes]]:
        type_, _flags, cid, aux = header
        if type_ == 1:
            requests.append(aux)
            return [[_header(2, cid), b"late"]] if speaks.is_set() else []
        if type_ == 4 and speaks.is_set():
            since = first_ping_s.setdefault(identity, time.monotonic())
            if time.monotonic() - since >= 0.5:
                return [[_header(5, 0)]]
        return []

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            first = await client.gather("mute", b"g", timeout_ms=3_000)
            (znode,) = first.missing
            assert client.instances("mute") == {znode: "dead"}  # within the 2 s wait for a first PONG
            second = await client.gather("mute", b"g", timeout_ms=1_000)
            assert second.missing == [znode] and requests == []  # dead: never asked
        finally:
            await client.close()
        speaks.set()
        client = await DirectClient.connect(zk_hosts)  # a new caller: its first PONG comes after 0.5 s
        try:
            third = await client.gather("mute", b"g", timeout_ms=3_000)
            assert [r.payload for r in third.replies] == [b"late"]
            (aux,) = requests
            assert 1_500 <= aux <= 2_600  # the time left after waiting for that PONG, not 3,000
        finally:
            await client.close()

    with _raw_instance(zk_server, zk_hosts, "mute", handle):
        asyncio.run(run())


def test_close_ends_asyncio_requests_in_flight_with_client_closed(zk_hosts: str) -> None:
    """As the blocking path does: an idempotent request in flight was retried on the closed
    sockets and failed as NoServiceAvailable ("send queue full"), a plain one as RequestTimeout."""

    async def slow(request: Request) -> bytes:
        await asyncio.sleep(2)
        return b"done"

    async def run() -> list[BaseException | sdk.Reply]:
        server = await DirectClient.connect(zk_hosts)
        client = await DirectClient.connect(zk_hosts)
        try:
            await server.serve("slow", slow, concurrency=4)
            calls = [asyncio.ensure_future(client.request("slow", b"x", timeout_ms=5_000, idempotent=idempotent))
                     for idempotent in (True, False)]
            # and a gather, which answered "no instance replied" (every instance missing)
            calls.append(asyncio.ensure_future(client.gather("slow", b"x", timeout_ms=5_000)))
            await asyncio.sleep(0.5)
            await client.close()
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await client.close()
            await server.close(drain_timeout_ms=100)

    outcomes = asyncio.run(run())
    assert [type(o).__name__ for o in outcomes] == ["ClientClosedError"] * 3


def test_a_cancelled_request_is_not_outstanding_any_more(zk_hosts: str) -> None:
    """asyncio.wait_for around request()/gather() cancels them: the instance must not keep
    counting them as outstanding, or least-outstanding selection sends everything to the
    other instances (200 cancelled requests skewed a split 150/0 in an audit)."""

    async def run() -> None:
        server = await DirectClient.connect(zk_hosts)
        client = await DirectClient.connect(zk_hosts)
        hold = asyncio.Event()

        async def stuck(request: Request) -> bytes:
            await hold.wait()
            return b""

        try:
            await server.serve("stuck", stuck, concurrency=64)
            for _ in range(20):
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(client.request("stuck", b"x", timeout_ms=30_000), 0.05)
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(client.gather("stuck", b"x", timeout_ms=30_000), 0.05)
            peers = list(client._views["stuck"].peers.values())
            assert peers and all(not peer.pending for peer in peers)
        finally:
            hold.set()
            await client.close()
            await server.close()

    asyncio.run(run())


def test_a_cancelled_or_refused_connect_closes_its_zookeeper_client(zk_hosts: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``connect()`` cancelled while its ZooKeeper client was starting (asyncio.wait_for
    running out), or refused for a bad option after it started, left that client running
    for good: its threads and its session."""
    from sdk.direct import _registry as registry

    started: list[KazooClient] = []
    real_start = registry.start_client

    def slow_start(*args: object, **kwargs: object) -> KazooClient:
        time.sleep(0.3)  # the caller gives up meanwhile
        client = real_start(*args, **kwargs)  # type: ignore[arg-type]
        started.append(client)
        return client

    monkeypatch.setattr(registry, "start_client", slow_start)

    async def run() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(DirectClient.connect(zk_hosts), 0.05)
        with pytest.raises(TypeError):
            await DirectClient.connect(zk_hosts, no_such_option=1)

    asyncio.run(run())
    deadline = time.monotonic() + 10
    while (len(started) < 2 or any(c.connected for c in started)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(started) == 2 and not any(c.connected for c in started)


# -- the second audit: registry entries, refusals, liveness, the wire's edges ------------

REPO = Path(__file__).resolve().parents[2]


def _ensure_chroot(zk_server: LocalZooKeeper, zk_hosts: str) -> None:
    admin = KazooClient(zk_server.address)
    admin.start()
    try:
        admin.ensure_path(zk_hosts[len(zk_server.address):])
    finally:
        admin.stop()
        admin.close()


@pytest.fixture
def registry_zk(zk_server: LocalZooKeeper, zk_hosts: str) -> Iterator[KazooClient]:
    """A ZooKeeper client inside the test's chroot, to write registry entries by hand."""
    _ensure_chroot(zk_server, zk_hosts)
    zk = KazooClient(zk_hosts)
    zk.start()
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


BAD_ENTRIES: list[object] = [{"address": "127.0.0.1:5555"}, {"address": "not a url"}, {"address": None},
                             {"address": 123}, {"address": ["x"]}, {"address": "tcp://127.0.0.1:1", "pid": "1"},
                             123, ["x"]]


def _register(zk: KazooClient, parent: str, prefix: str, data: object) -> str:
    path: str = zk.create(f"{parent}/{prefix}", json.dumps(data).encode(), ephemeral=True, sequence=True,
                          makepath=True)
    return path


def test_bad_registry_entries_cost_only_themselves(registry_zk: KazooClient, zk_hosts: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """One bad entry under a service (an address without tcp://, null, a number, a wrong
    type) made every SDK client unable to use the whole service: new clients waited for a
    registry answer that never came, running ones stopped seeing changes. One bad
    publisher entry broke subscriptions the same way. Now each is skipped with one
    warning per znode, and the good instances keep serving."""

    async def run() -> None:
        server = await DirectClient.connect(zk_hosts)
        running = await DirectClient.connect(zk_hosts)
        fresh: DirectClient | None = None
        try:
            await server.serve("mixed", lambda request: b"one")
            assert (await running.request("mixed", b"x", timeout_ms=3_000)).payload == b"one"
            for data in BAD_ENTRIES:  # one registry change each: a running client sees them all
                _register(registry_zk, "/fabric/services/mixed", "instance-", data)
                _register(registry_zk, "/fabric/publishers", "publisher-", data)
            await asyncio.sleep(0.3)
            await server.serve("mixed", lambda request: b"two")
            await _wait_for(lambda: sorted(running.instances("mixed").values()) == ["alive", "alive"])
            assert sorted(running.instances("mixed").values()) == ["alive", "alive"]
            gathered = await running.gather("mixed", b"g", timeout_ms=2_000)
            assert sorted(r.payload for r in gathered.replies) == [b"one", b"two"] and not gathered.missing

            fresh = await DirectClient.connect(zk_hosts)
            assert (await fresh.request("mixed", b"x", timeout_ms=3_000)).payload in (b"one", b"two")
            subscription = await fresh.subscribe("mixed.>")
            await server.start_publisher()
            await _wait_for(lambda: subscription.publishers == 1)
            assert subscription.publishers == 1
            await asyncio.sleep(0.3)  # the TCP connection (slow joiner)
            await server.publish("mixed.a", b"m")
            message = await subscription.next(timeout_ms=3_000)
            assert message is not None and message.payload == b"m"
        finally:
            if fresh is not None:
                await fresh.close()
            await running.close()
            await server.close()

    with caplog.at_level(logging.WARNING, logger="fabric.direct"):
        asyncio.run(run())
    text = caplog.text
    assert "Exception in callback" not in text and "Traceback" not in text
    warnings = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    for parent, clients in (("/fabric/services/mixed", 2), ("/fabric/publishers", 1)):
        for child in registry_zk.get_children(parent):
            said = [w for w in warnings if f"{parent}/{child} " in w]
            if child.startswith(("instance-", "publisher-")) and said:
                assert len(said) <= clients, said  # once per watching client, not once per change
    assert sum(1 for w in warnings if "/fabric/services/mixed/" in w) == 2 * len(BAD_ENTRIES)


def test_service_list_shows_the_good_entries_and_names_the_bad(registry_zk: KazooClient, zk_hosts: str) -> None:
    """`fabric service list` failed with "internal error TypeError" on an entry of other
    JSON types, and showed ~1.8e9 s of uptime for one without started_ms."""
    _register(registry_zk, "/fabric/services/probe", "instance-", {"address": "tcp://127.0.0.1:2"})
    bad = [_register(registry_zk, "/fabric/services/probe", "instance-", data)
           for data in ({"address": "tcp://127.0.0.1:3", "started_ms": "1795509325651"}, {"address": None},
                        {"address": "tcp://127.0.0.1:4", "pid": None, "load": [1]})]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FABRIC_DEBUG", None)
    for extra in ([], ["--json"]):
        done = subprocess.run([sys.executable, "-m", "fabric", "service", "list", "--bootstrap", f"zk://{zk_hosts}",
                               *extra], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert "internal error" not in done.stderr
        for path in bad:
            assert path.rsplit("/", 1)[1] in done.stderr  # named, on stderr
        if extra:
            listed = json.loads(done.stdout)["probe"]
            assert [info["address"] for info in listed.values()] == ["tcp://127.0.0.1:2"]
        else:
            row = next(line for line in done.stdout.splitlines() if line.startswith("probe"))
            assert row.split()[-1] == "-" and "tcp://127.0.0.1:2" in row  # uptime unknown, not 1970
            assert len([line for line in done.stdout.splitlines() if line.startswith("probe")]) == 1


def test_a_handler_raising_overloaded_or_stopping_runs_once(zk_hosts: str) -> None:
    """Codes 53/54 tell the caller the handler did not run, so it retries elsewhere even a
    non-idempotent request: a handler that raised ServiceOverloaded (say, from a call of
    its own) ran 3 times. It is now answered as a handler error, RemoteError."""
    calls: list[bytes] = []

    async def handler(request: Request) -> bytes:
        calls.append(request.payload)
        if request.payload == b"over":
            raise sdk.ServiceOverloaded("downstream is busy")
        raise sdk.ServiceStopping("downstream is stopping")

    def sync_handler(request: Request) -> bytes:
        calls.append(request.payload)
        raise sdk.ServiceOverloaded("downstream is busy")

    async def run() -> None:
        server = await DirectClient.connect(zk_hosts)
        client = await DirectClient.connect(zk_hosts)
        try:
            for _ in range(2):  # two instances: the retry had somewhere to go
                await server.serve("once", handler)
                await server.serve("once-sync", sync_handler)
            for name, payload, remote_type in (("once", b"over", "ServiceOverloaded"),
                                               ("once", b"stop", "ServiceStopping"),
                                               ("once-sync", b"sync", "ServiceOverloaded")):
                calls.clear()
                with pytest.raises(errors.RemoteError) as caught:
                    await client.request(name, payload, timeout_ms=3_000)
                assert caught.value.remote_type == remote_type
                assert calls == [payload]  # ran once, not retried
        finally:
            await client.close()
            await server.close()

    asyncio.run(run())
    blocking_calls = len(calls)
    with sdk.Client(f"zk://{zk_hosts}") as client:
        client.serve("once-blocking", handler)
        client.serve("once-blocking", handler)
        with pytest.raises(errors.RemoteError, match="ServiceOverloaded"):
            client.request("once-blocking", b"over", timeout_ms=3_000)
    assert len(calls) == blocking_calls + 1


class _RawInstance:
    """A service instance written from docs/PROTOCOL.md section 10, registered by hand: it
    answers PINGs, and REQUESTs with SERVICE_STOPPING while ``refusing`` is set, else
    with a REPLY; ``silent`` makes it answer nothing at all."""

    def __init__(self, zk: KazooClient, name: str) -> None:
        self.refusing = threading.Event()
        self.silent = threading.Event()
        self.requests = 0
        self._stop = threading.Event()
        self._router = zmq.Context.instance().socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        port = self._router.bind_to_random_port("tcp://127.0.0.1")
        self.znode = _register(zk, f"/fabric/services/{name}", "instance-",
                               {"address": f"tcp://127.0.0.1:{port}"}).rsplit("/", 1)[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(20):
                continue
            identity, header, *rest = self._router.recv_multipart()
            if self.silent.is_set():
                continue
            _magic, _version, type_, _flags, _reserved, cid, _aux = _HEADER.unpack(header)
            if type_ == 4:
                self._router.send_multipart([identity, _header(5, 0)])
            elif type_ == 1:
                self.requests += 1
                if self.refusing.is_set():
                    body = struct.pack("<hH", 54, 15) + b"ServiceStopping" + struct.pack("<H", 4) + b"busy"
                    self._router.send_multipart([identity, _header(3, cid), body])
                else:
                    self._router.send_multipart([identity, _header(2, cid), b"raw:" + rest[0]])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._router.close()


def test_an_instance_that_answered_stopping_is_tried_again(registry_zk: KazooClient, zk_hosts: str) -> None:
    """One SERVICE_STOPPING retired an instance in that client for good, though it kept
    answering PINGs and stayed registered ("1 registered, none answering" ever after).
    It is now out of selection for STOPPING_HOLD_S, then tried again; asyncio and blocking."""
    raw = _RawInstance(registry_zk, "comeback")

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            assert (await client.request("comeback", b"a", timeout_ms=3_000)).payload == b"raw:a"
            raw.refusing.set()
            with pytest.raises(errors.NoServiceAvailable, match="SERVICE_STOPPING"):
                await client.request("comeback", b"b", timeout_ms=300)  # well within the 1 s hold
            assert client.instances("comeback") == {raw.znode: "stopping"}
            raw.refusing.clear()
            await asyncio.sleep(_peers.STOPPING_HOLD_S + 0.3)
            assert client.instances("comeback") == {raw.znode: "alive"}
            assert (await client.request("comeback", b"c", timeout_ms=3_000)).payload == b"raw:c"
            # Refused while a request waits: it is sent again once the hold ends (nothing ran).
            raw.refusing.set()
            asyncio.get_running_loop().call_later(0.3, raw.refusing.clear)
            assert (await client.request("comeback", b"d", timeout_ms=5_000)).payload == b"raw:d"
        finally:
            await client.close()

    try:
        asyncio.run(run())
        with sdk.Client(f"zk://{zk_hosts}") as client:
            assert client.request("comeback", b"e", timeout_ms=3_000).payload == b"raw:e"
            raw.refusing.set()
            with pytest.raises(errors.NoServiceAvailable):
                client.request("comeback", b"f", timeout_ms=500)
            raw.refusing.clear()
            time.sleep(_peers.STOPPING_HOLD_S + 0.3)
            assert client.request("comeback", b"g", timeout_ms=3_000).payload == b"raw:g"
    finally:
        raw.close()


def test_gather_reports_a_silent_instance_missing(registry_zk: KazooClient, zk_hosts: str) -> None:
    """gather() to a service whose only instance never answers raised NoServiceAvailable,
    while the same instance beside a live one was reported in ``missing``."""
    raw = _RawInstance(registry_zk, "quiet")
    raw.silent.set()

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            gathered = await client.gather("quiet", b"g", timeout_ms=500)
            assert (gathered.replies, gathered.missing, gathered.failed) == ([], [raw.znode], {})
            with pytest.raises(errors.RequestTimeout) as caught:
                await client.gather("quiet", b"g", timeout_ms=300, min_replies=1)
            assert caught.value.result.missing == [raw.znode]  # type: ignore[attr-defined]
            await client.serve("quiet", lambda request: b"here")
            await _wait_for(lambda: "alive" in client.instances("quiet").values())
            gathered = await client.gather("quiet", b"g", timeout_ms=500)
            assert [r.payload for r in gathered.replies] == [b"here"] and gathered.missing == [raw.znode]
            # A float timeout, which request() takes, raised TypeError in gather's encoder and
            # left its first target's pending entry behind.
            gathered = await client.gather("quiet", b"g", timeout_ms=400.5)
            assert [r.payload for r in gathered.replies] == [b"here"] and gathered.missing == [raw.znode]
            with pytest.raises(errors.NoServiceAvailable, match="registered"):
                await client.gather("nobody-here", b"g", timeout_ms=300)
        finally:
            await client.close()

    try:
        asyncio.run(run())
    finally:
        raw.close()


def _dealer(address: str) -> zmq.Socket[bytes]:
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 5_000)
    dealer.connect(address)
    return dealer


def test_what_an_instance_answers_to_what_it_cannot_take(zk_hosts: str) -> None:
    """PROTOCOL.md section 10.1 as it now reads: a header that does not decode is answered
    ERROR with the specific code (6 bad magic, 4 bad version, 3 anything else) and
    correlation id 0; a REQUEST with wrong frames, 3 with its id; REPLY, ERROR, PONG and
    PUBLISH sent to an instance get no answer; a PING is answered PONG (correlation id 0)
    whatever follows its header."""

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            service = await client.serve("edges", lambda request: b"ok")
            dealer = _dealer(service.address)
            loop = asyncio.get_running_loop()

            async def exchange(frames: list[bytes]) -> list[bytes]:
                dealer.send_multipart(frames)
                return await loop.run_in_executor(None, dealer.recv_multipart)

            def error(answer: list[bytes]) -> tuple[int, int]:
                header = _HEADER.unpack(answer[0])
                assert header[2] == 3, answer
                return header[5], struct.unpack_from("<h", answer[1])[0]

            bad_magic = struct.pack("<IBBBBII", 0x31524246, 1, 1, 0, 0, 5, 0)
            bad_version = struct.pack("<IBBBBII", 0x31444246, 2, 1, 0, 0, 5, 0)
            assert error(await exchange([bad_magic, b"x"])) == (0, errors.InvalidMagicError.code)
            assert error(await exchange([bad_version, b"x"])) == (0, errors.UnsupportedVersionError.code)
            assert error(await exchange([_header(9, 5), b"x"])) == (0, errors.MalformedRequestError.code)
            assert error(await exchange([_header(1, 5, flags=0x80), b"x"])) == (0, errors.MalformedRequestError.code)
            assert error(await exchange([b"short"])) == (0, errors.MalformedRequestError.code)
            assert error(await exchange([_header(1, 5), b"x", b"extra"])) == (5, errors.MalformedRequestError.code)
            for stray in ([_header(2, 6), b"r"], [_header(3, 6), b"e"], [_header(5, 6)], [_header(6, 6), b"p"]):
                dealer.send_multipart(stray)
            answer = await exchange([_header(4, 77, aux=200), b"extra frame"])
            assert answer == [_header(5, 0, aux=0)]  # the next answer is this PONG: strays got none
            assert await exchange([_header(1, 8), b"x"]) == [_header(2, 8), b"ok"]
            dealer.close()
        finally:
            await client.close()

    asyncio.run(run())


def test_a_caller_that_only_sends_requests_after_one_ping_stays_followed(zk_hosts: str) -> None:
    """The instance counted only PINGs as signs of life: a caller that PINGed once and
    then sent only REQUESTs was declared gone 800 ms later and its queued requests were
    dropped (answered SERVICE_OVERLOADED). Any frame counts now."""

    async def slow_then_quick(request: Request) -> bytes:
        # The first 8 take 150 ms each, so requests queue while the old rule's 800 ms ran
        # out; the rest are quick, so the backlog is gone well before the caller's last
        # frame is 800 ms old (under the new rule too, a caller that stops sending is gone).
        await asyncio.sleep(0.15 if int(request.payload) < 8 else 0.01)
        return request.payload

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            service = await client.serve("steady", slow_then_quick, concurrency=1)
            dealer = _dealer(service.address)
            loop = asyncio.get_running_loop()
            dealer.send_multipart([_header(4, 0, aux=200)])  # followed from now on
            assert (await loop.run_in_executor(None, dealer.recv_multipart))[0][5] == 5  # PONG
            for i in range(15):  # a request every 100 ms for 1.5 s, no PING
                dealer.send_multipart([_header(1, 100 + i), b"%d" % i])
                await asyncio.sleep(0.1)
            answers = [await loop.run_in_executor(None, dealer.recv_multipart) for _ in range(15)]
            assert [_HEADER.unpack(a[0])[2] for a in answers] == [2] * 15, answers  # every one a REPLY
            assert service.callers_lost == 0 and service.requests_dropped == 0
            dealer.close()
        finally:
            await client.close()

    asyncio.run(run())


def test_direct_client_connects_with_a_zk_url(zk_server: LocalZooKeeper, zk_hosts: str) -> None:
    """DIRECT.md's DirectClient.connect(zk, ...) took only host:port: "zk://host:port" (what
    sdk.connect takes) stalled 15 s on "Cannot resolve zk" and failed."""
    _ensure_chroot(zk_server, zk_hosts)

    async def run() -> None:
        started = time.monotonic()
        client = await DirectClient.connect(f"zk://{zk_hosts}")
        try:
            await client.serve("url", lambda request: b"yes")
            assert (await client.request("url", b"", timeout_ms=3_000)).payload == b"yes"
        finally:
            await client.close()
        assert time.monotonic() - started < 10
        with pytest.raises(errors.InvalidRequestError, match="ZooKeeper"):
            await DirectClient.connect("tcp://127.0.0.1:9092")

    asyncio.run(run())
    direct = sdk.direct.SyncDirect(f"zk://{zk_hosts}")
    try:
        assert direct.services()["url"] == {}  # registered before, stopped since
    finally:
        direct.close()


def test_a_stopping_instance_tells_its_callers_and_refuses_late_requests(
        zk_hosts: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """stop() deregistered and closed at once when nothing was in flight: a caller whose
    ZooKeeper watch had not fired yet sent its next request to a closed socket, and that
    request failed as "stopped answering heartbeats (may have run)" though nothing ran.
    The instance now tells the callers that PING (ERROR, correlation id 0,
    SERVICE_STOPPING) and stays open STOP_HOLD_MS refusing late requests."""
    from fabric.protocol import direct as wire
    from sdk.direct import _server

    monkeypatch.setattr(_server, "STOP_HOLD_MS", 1_500)  # a window wide enough for a loaded machine

    async def run() -> None:
        server = await DirectClient.connect(zk_hosts)
        try:
            service = await server.serve("notice", lambda r: b"ok")
            dealer = zmq.Context.instance().socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVTIMEO, 5_000)
            dealer.connect(service.address)
            loop = asyncio.get_running_loop()
            try:
                dealer.send_multipart([_header(4, 0, aux=200)])  # PING: a followed caller
                pong = await loop.run_in_executor(None, dealer.recv_multipart)
                assert _HEADER.unpack(pong[0])[2] == 5
                stopping = asyncio.ensure_future(service.stop())
                notice = await loop.run_in_executor(None, dealer.recv_multipart)
                _magic, _version, type_, _flags, _reserved, cid, _aux = _HEADER.unpack(notice[0])
                assert (type_, cid) == (3, 0)
                assert wire.decode_error(notice[1]).code == errors.ServiceStopping.code
                dealer.send_multipart([_header(1, 9, aux=1_000), b"late"])  # sent before its watch fired
                answer = await loop.run_in_executor(None, dealer.recv_multipart)
                _magic, _version, type_, _flags, _reserved, cid, _aux = _HEADER.unpack(answer[0])
                assert (type_, cid) == (3, 9)
                assert wire.decode_error(answer[1]).code == errors.ServiceStopping.code  # refused: nothing ran
                await asyncio.wait_for(stopping, 10)
            finally:
                dealer.close()
        finally:
            await server.close()

    asyncio.run(run())

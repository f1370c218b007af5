"""Regressions found auditing the direct plane against its documents (docs/DIRECT.md,
docs/PROTOCOL.md section 10): what an outside reviewer would try first."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
import uuid

import pytest
import zmq
from kazoo.client import KazooClient

import sdk
from fabric import errors
from fabric.local import LocalZooKeeper
from sdk.direct import DirectClient, Request


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
        ]:
            with pytest.raises(TypeError, match=text):
                call()
        with pytest.raises(errors.InvalidRequestError, match="queue_max"):
            client.serve("x", lambda r: b"", queue_max=-1)
        assert client.services() == {}  # nothing was registered by the refused calls


_HEADER = struct.Struct("<IBBBBII")


def _header(type_: int, cid: int, flags: int = 0, aux: int = 0) -> bytes:
    return _HEADER.pack(0x31444246, 1, type_, flags, 0, cid, aux)


def test_raw_pyzmq_peers_written_from_protocol_md(zk_server: LocalZooKeeper, zk_hosts: str) -> None:
    """docs/PROTOCOL.md section 10 alone: a raw ROUTER instance registered by hand serves
    SDK callers; a raw DEALER caller (no PINGs) and a raw SUB subscriber use SDK peers."""
    chroot = zk_hosts[len(zk_server.address):]
    admin = KazooClient(zk_server.address)
    admin.start()
    admin.ensure_path(chroot)
    admin.stop()
    admin.close()
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    zk = KazooClient(zk_hosts)
    zk.start()
    zk.create("/fabric/services/raw/instance-", json.dumps({"address": f"tcp://127.0.0.1:{port}"}).encode(),
              ephemeral=True, sequence=True, makepath=True)
    stop = threading.Event()

    def serve() -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while not stop.is_set():
            if not poller.poll(50):
                continue
            identity, header, *rest = router.recv_multipart()
            _magic, _version, type_, _flags, _reserved, cid, _aux = _HEADER.unpack(header)
            if type_ == 4:  # PING -> PONG, load 0
                router.send_multipart([identity, _header(5, 0)])
            elif type_ == 1:  # REQUEST -> REPLY
                router.send_multipart([identity, _header(2, cid), b"raw:" + rest[0]])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

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

    try:
        asyncio.run(run())
    finally:
        stop.set()
        thread.join(5)
        router.close()
        zk.stop()
        zk.close()


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

"""The direct plane on uvloop (the ``speed`` extra): the SDK drives plain ZeroMQ sockets
with ``loop.add_reader`` on their edge-triggered FD (sdk/direct/_io.py), which must work on
uvloop's libuv poller exactly as on the standard selector loop."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from fabric.local import LocalZooKeeper
from sdk.direct import DirectClient, Request

uvloop = pytest.importorskip("uvloop")


def test_serve_request_gather_and_pubsub_on_uvloop(zk_server: LocalZooKeeper) -> None:
    zk = f"{zk_server.address}/direct-uv-{uuid.uuid4().hex[:10]}"
    name = f"echo-{uuid.uuid4().hex[:6]}"

    async def echo(request: Request) -> bytes:
        return request.payload

    async def run() -> None:
        assert "uvloop" in type(asyncio.get_running_loop()).__module__
        server = await DirectClient.connect(zk)
        client = await DirectClient.connect(zk)
        try:
            for _ in range(3):
                await server.serve(name, echo)
            replies = await asyncio.gather(*[client.request(name, f"r{i}", timeout_ms=10_000, idempotent=True)
                                             for i in range(200)])
            assert [r.payload for r in replies] == [f"r{i}".encode() for i in range(200)]
            gathered = await client.gather(name, b"all", timeout_ms=10_000)
            assert len(gathered.replies) == 3 and not gathered.missing
            subscription = await client.subscribe("uv.>")
            await server.start_publisher()
            message = None
            for _ in range(100):  # until the SUB has connected (PUB/SUB drops before that)
                await server.publish("uv.test", b"hello")
                message = await subscription.next(timeout_ms=100)
                if message is not None:
                    break
            assert message is not None and message.subject == "uv.test"
        finally:
            await client.close()
            await server.close()

    uvloop.run(run())

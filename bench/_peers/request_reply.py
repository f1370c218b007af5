"""Request-reply round trips: NATS core request/reply, a raw pyzmq REQ/REP pair (the floor
any ZeroMQ-based service call can reach from Python), and Fabric's direct plane when it
exists. The responder runs in another process in every case; the requester sends one
request at a time and times each round trip."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from typing import Any

from bench._peers.workloads import REQUEST_TIMEOUT_S, VALUE, Progress

RESPONDER_READY_TIMEOUT_S = 30.0
SUBJECT = "bench.echo"
SERVICE = "bench-echo"
DISCOVERY_TIMEOUT_S = 15.0  # the new instance must appear in the requester's registry view


def direct_plane_missing() -> str | None:
    """Why the Fabric direct-plane row cannot run, or None."""
    if importlib.util.find_spec("sdk.direct") is None:
        return "not built yet (sdk/direct is not on main)"
    if not hasattr(importlib.import_module("sdk.direct"), "DirectClient"):
        return "sdk.direct has no DirectClient"
    return None


# -- responders (run in spawned processes until stop is set) ------------------------------

def nats_responder(url: str, ready: Any, stop: Any) -> None:
    async def run() -> None:
        import nats

        nc = await nats.connect(url, max_reconnect_attempts=0)

        async def echo(msg: Any) -> None:
            await msg.respond(msg.data)

        await nc.subscribe(SUBJECT, cb=echo)
        await nc.flush()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await nc.close()

    asyncio.run(run())


def zmq_responder(endpoint: str, ready: Any, stop: Any) -> None:
    import zmq

    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.setsockopt(zmq.LINGER, 0)
    rep.bind(endpoint)
    ready.set()
    try:
        while not stop.is_set():
            if rep.poll(50):
                rep.send(rep.recv())
    finally:
        rep.close()
        ctx.term()


def direct_responder(zk_address: str, ready: Any, stop: Any) -> None:
    async def run() -> None:
        direct: Any = importlib.import_module("sdk.direct")

        async def echo(request: Any) -> bytes:
            return bytes(request.payload)

        client = await direct.DirectClient.connect(zk_address)
        try:
            await client.serve(SERVICE, echo)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
        finally:
            await client.close()

    asyncio.run(run())


# -- requesters ---------------------------------------------------------------------------

def nats_requests(url: str, count: int, progress: Progress) -> list[int]:
    async def run() -> list[int]:
        import nats

        nc = await nats.connect(url, max_reconnect_attempts=0)
        try:
            await nc.request(SUBJECT, VALUE, timeout=REQUEST_TIMEOUT_S)  # warm-up
            out: list[int] = []
            for _ in range(count):
                started = time.perf_counter_ns()
                await nc.request(SUBJECT, VALUE, timeout=REQUEST_TIMEOUT_S)
                out.append(time.perf_counter_ns() - started)
                progress(1)
            return out
        finally:
            await nc.close()

    return asyncio.run(run())


def zmq_requests(endpoint: str, count: int, progress: Progress) -> list[int]:
    import zmq

    ctx = zmq.Context()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.RCVTIMEO, int(REQUEST_TIMEOUT_S * 1000))
    req.connect(endpoint)
    try:
        req.send(VALUE)
        req.recv()  # warm-up: the connection is up
        out: list[int] = []
        for _ in range(count):
            started = time.perf_counter_ns()
            req.send(VALUE)
            req.recv()
            out.append(time.perf_counter_ns() - started)
            progress(1)
        return out
    finally:
        req.close()
        ctx.term()


def direct_requests(zk_address: str, count: int, progress: Progress) -> list[int]:
    async def run() -> list[int]:
        direct: Any = importlib.import_module("sdk.direct")
        client = await direct.DirectClient.connect(zk_address)
        try:
            deadline = time.monotonic() + DISCOVERY_TIMEOUT_S
            while True:  # warm-up; the first requests may precede discovery of the instance
                try:
                    await client.request(SERVICE, VALUE)
                    break
                except direct.NoServiceAvailable:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            out: list[int] = []
            for _ in range(count):
                started = time.perf_counter_ns()
                await client.request(SERVICE, VALUE)
                out.append(time.perf_counter_ns() - started)
                progress(1)
            return out
        finally:
            await client.close()

    return asyncio.run(run())

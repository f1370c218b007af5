"""Heartbeats both ways (Paranoid Pirate) with real processes and real SIGSTOP: an instance
notices a caller that stopped heartbeating and drops the requests it queued for it; the
caller side (an instance that stops answering) is in test_direct.py."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from fabric.local import LocalZooKeeper, ManagedProcess
from sdk.direct import DirectClient, Request

ROOT = Path(__file__).parents[2]
REQUESTS = 20
HANDLER_S = 0.3


@pytest.fixture
def zk_hosts(zk_server: LocalZooKeeper) -> str:
    return f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"


async def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


def test_instance_drops_the_queue_of_a_stalled_caller(zk_hosts: str, tmp_path: Path) -> None:
    ran: list[bytes] = []
    caller = ManagedProcess("caller", [sys.executable, "-m", "tests.integration.direct_caller", zk_hosts, "slowpoke",
                                       str(REQUESTS)],
                            tmp_path / "caller.log", env={**os.environ, "PYTHONPATH": str(ROOT)})

    async def slow(request: Request) -> bytes:
        ran.append(request.payload)
        await asyncio.sleep(HANDLER_S)
        return b"done"

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        try:
            service = await client.serve("slowpoke", slow, concurrency=1)
            caller.start()
            await wait_for(lambda: service.in_flight >= REQUESTS, 30, "the caller's requests to queue up")
            assert service.callers == 1  # the caller PINGs, so the instance follows it
            caller.pause()
            paused_at = time.monotonic()
            # 800 ms of silence, long before any ZooKeeper session would expire (10 s).
            await wait_for(lambda: service.callers_lost == 1, 5, "the instance to notice the stalled caller")
            noticed_s = time.monotonic() - paused_at
            await wait_for(lambda: service.in_flight == 0, 5, "the running handler to finish")
            assert service.requests_dropped > 0
            assert len(ran) + service.requests_dropped == REQUESTS  # dropped ones never ran
            assert service.callers == 0
            print(f"stalled caller noticed after {noticed_s * 1000:.0f} ms; "
                  f"{service.requests_dropped} queued requests dropped, {len(ran)} ran")
        finally:
            caller.kill()
            await client.close()

    asyncio.run(run())


def test_a_caller_that_was_paused_still_gets_its_replies(zk_hosts: str, tmp_path: Path) -> None:
    """The caller itself SIGSTOPped for 2 s with requests in flight: it sent no PINGs
    meanwhile, so on waking it must not blame the instance for the silence (and fail the
    requests) before reading the replies waiting in its socket."""
    caller = ManagedProcess("caller", [sys.executable, "-m", "tests.integration.direct_caller", zk_hosts, "steady",
                                       "4"],
                            tmp_path / "caller.log", env={**os.environ, "PYTHONPATH": str(ROOT)})

    async def steady(request: Request) -> bytes:
        await asyncio.sleep(0.5)
        return b"done"

    async def run() -> str:
        client = await DirectClient.connect(zk_hosts)
        try:
            service = await client.serve("steady", steady, concurrency=8)
            caller.start()
            await wait_for(lambda: service.in_flight >= 4, 30, "the caller's requests to arrive")
            caller.pause()
            await asyncio.sleep(2.0)
            caller.resume()
            await wait_for(lambda: "DONE" in caller.log_tail(), 30, "the caller to finish")
            return caller.log_tail()
        finally:
            caller.kill()
            await client.close()

    log = asyncio.run(run())
    assert "DONE ok=4 failures=[]" in log, log

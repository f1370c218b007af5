"""Services and callers coming and going leave nothing behind (docs/DIRECT.md, "Bounds"):
a service's name znode goes once its last instance went, stopped or SIGKILLed (a ZooKeeper
container), and a caller forgets the services it stopped calling. Real ZooKeeper, real
processes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from fabric import errors
from fabric.local import LocalZooKeeper
from sdk.direct import DirectClient, Request
from sdk.direct._registry import service_path

ROOT = Path(__file__).parents[2]
GONE_TIMEOUT_S = 30.0  # the killed instance's ZooKeeper session (10 s) plus the container check


@pytest.fixture
def zk_hosts(zk_server: LocalZooKeeper) -> str:
    return f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"


def _wait_gone(zk: KazooClient, path: str) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while zk.exists(path) is not None:
        assert time.monotonic() < deadline, f"{path} still there after {GONE_TIMEOUT_S} s: {zk.get_children(path)}"
        time.sleep(0.2)


async def _echo(request: Request) -> bytes:
    return request.payload


@pytest.mark.slow
def test_a_service_name_leaves_no_znode_after_its_instances_stop_or_are_killed(zk_hosts: str) -> None:
    servers, _, chroot = zk_hosts.partition("/")
    root = KazooClient(hosts=servers)
    root.start(timeout=30)
    root.ensure_path("/" + chroot)
    root.stop()
    root.close()
    zk = KazooClient(hosts=zk_hosts)
    zk.start(timeout=30)

    async def stopped_in_process() -> None:
        async with await DirectClient.connect(zk_hosts) as client:
            service = await client.serve("stopped", _echo)
            assert zk.exists(service_path("stopped")) is not None
            await service.stop()
            await asyncio.to_thread(_wait_gone, zk, service_path("stopped"))
            # The name serves again after its znode went: the registration makes it anew.
            await client.serve("stopped", _echo)
            reply = await client.request("stopped", b"again", timeout_ms=5_000)
            assert reply.payload == b"again"

    try:
        asyncio.run(stopped_in_process())
        killed = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.direct_service", zk_hosts, "killed", "/dev/null"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert killed.stdout is not None and killed.stdout.readline().startswith("READY")
            assert zk.exists(service_path("killed")) is not None
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.wait()
        _wait_gone(zk, service_path("killed"))  # its session expires, then the empty container goes
    finally:
        zk.stop()
        zk.close()


def test_a_caller_forgets_services_it_stopped_calling(zk_hosts: str) -> None:
    async def main() -> None:
        async with await DirectClient.connect(zk_hosts) as server, \
                await DirectClient.connect(zk_hosts, service_view_idle_ms=500) as caller:
            for i in range(5):
                await server.serve(f"once-{i}", _echo)
                assert (await caller.request(f"once-{i}", b"x", timeout_ms=5_000)).payload == b"x"
            with pytest.raises(errors.NoServiceAvailable):
                await caller.request("nobody", b"x", timeout_ms=200)
            assert len(caller._views) == 6
            deadline = time.monotonic() + 10
            while caller._views:
                assert time.monotonic() < deadline, f"views kept: {sorted(caller._views)}"
                await asyncio.sleep(0.1)
            assert caller.instances("once-0") == {}
            assert (await caller.request("once-0", b"back", timeout_ms=5_000)).payload == b"back"  # read again

    asyncio.run(main())

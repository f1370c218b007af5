"""A seeded fault run of the direct plane: instances paused, killed, stopped gracefully and
replaced at random while callers keep sending idempotent and plain requests. Idempotent
requests must all complete; plain ones must never run twice (and run exactly once when
they were answered). A failure prints the seed that reproduces it:
``FABRIC_CHAOS_SEED=<seed> pytest tests/integration/test_direct_chaos.py``."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk
from fabric import errors
from fabric.local import LocalZooKeeper
from sdk.direct import DirectClient
from tests.integration.test_direct import Instance, start_instances

RUN_S = 8.0  # about ten faults per run; the seed differs each run
WORKERS = 12


@pytest.fixture
def zk_hosts(zk_server: LocalZooKeeper) -> str:
    return f"{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def instances() -> Iterator[list[Instance]]:
    started: list[Instance] = []
    yield started
    for instance in started:
        instance.process.stop()


@pytest.mark.slow
@pytest.mark.parametrize("api", ["asyncio", "blocking"])
def test_random_faults_never_run_a_plain_request_twice(api: str, instances: list[Instance], tmp_path: Path,
                                                       zk_hosts: str) -> None:
    seed = int(os.environ.get("FABRIC_CHAOS_SEED", random.randrange(1 << 32)))
    rng = random.Random(seed)
    start_instances(instances, tmp_path, zk_hosts, "chaos", 3)
    outcomes: dict[str, str] = {}
    actions: list[str] = []
    paused: dict[Instance, float] = {}  # instance -> when to resume it

    def healthy() -> list[Instance]:
        return [i for i in instances if i.process.running and i not in paused]

    async def run() -> None:
        client = await DirectClient.connect(zk_hosts)
        blocking = sdk.Client(f"zk://{zk_hosts}") if api == "blocking" else None  # calls on worker threads
        stop = asyncio.Event()
        ids = iter(range(10**9))

        async def worker(idempotent: bool) -> None:
            while not stop.is_set():
                rid = f"{'i' if idempotent else 'n'}{next(ids)}"
                # A generous timeout: the property is that idempotent requests complete (over
                # retries, around paused and restarting instances), not how fast on a loaded machine.
                try:
                    if blocking is not None:
                        reply = await asyncio.to_thread(blocking.request, "chaos", f"run:{rid}", timeout_ms=10_000,
                                                        idempotent=idempotent)
                    else:
                        reply = await client.request("chaos", f"run:{rid}", timeout_ms=10_000, idempotent=idempotent)
                    outcomes[rid] = "ok" if reply.payload.decode().startswith(f"{rid}@") else "wrong reply"
                except errors.FabricError as exc:
                    outcomes[rid] = f"{type(exc).__name__}: {exc} (at {time.monotonic() - began:.1f}s)"
                await asyncio.sleep(rng.random() * 0.01)

        workers = [asyncio.ensure_future(worker(n % 2 == 0)) for n in range(WORKERS)]
        began = time.monotonic()
        try:
            while time.monotonic() - began < RUN_S:
                await asyncio.sleep(0.3 + rng.random() * 0.5)
                now = time.monotonic()
                for instance, until in list(paused.items()):
                    if now >= until:
                        instance.process.resume()
                        del paused[instance]
                candidates = healthy()
                if len(candidates) < 2:  # keep one instance able to answer at all times
                    continue
                victim = rng.choice(candidates)
                action = rng.choice(["pause", "pause", "kill", "term"])
                actions.append(f"{now - began:.1f}s {action} {victim.znode}")
                if action == "pause":
                    victim.process.pause()
                    paused[victim] = now + 0.3 + rng.random() * 1.5
                else:
                    victim.process.kill() if action == "kill" else victim.process.signal(15)
                    await asyncio.to_thread(start_instances, instances, tmp_path, zk_hosts, "chaos", 1)
            stop.set()
            await asyncio.gather(*workers)
        finally:
            for instance in list(paused):
                instance.process.resume()
            if blocking is not None:
                await asyncio.to_thread(blocking.close)
            await client.close()

    asyncio.run(run())
    time.sleep(1.0)  # resumed instances run what was queued to them: it must not make a second run
    runs = collections.Counter(rid for instance in instances for rid in instance.handled())
    context = f"reproduce with FABRIC_CHAOS_SEED={seed}; actions: {actions}"
    idempotent = [r for r in outcomes if r.startswith("i")]
    plain = [r for r in outcomes if r.startswith("n")]
    assert idempotent and plain and actions, context
    failed = {r: outcomes[r] for r in idempotent if outcomes[r] != "ok"}
    assert not failed, f"idempotent requests failed: {failed}; {context}"
    assert all(runs[r] <= 1 for r in plain), f"a plain request ran twice; {context}"
    assert all(runs[r] == 1 for r in plain if outcomes[r] == "ok"), f"an answered request never ran; {context}"
    print(f"{api} seed {seed}: {len(idempotent)} idempotent, {len(plain)} plain "
          f"({sum(outcomes[r] == 'ok' for r in plain)} answered), {len(actions)} faults")

"""The asyncio clients (sdk/aio.py) through a leader's SIGKILL and SIGSTOP, judged by the
history checker as the threaded clients' fault tests are.

An asyncio producer (acks=all, idempotent, default max_in_flight) writes while an
``async for`` reader reads every partition and a group member polls, some of its polls
cut short by ``asyncio.wait_for``. A cancelled poll goes on on the consumer's worker
thread and takes records for nobody: it used to leave the positions past them, so the
member skipped them and its next commit covered them (found by this audit; the
deterministic test is tests/integration/test_groups.py). Checked: no acknowledged write
lost, none duplicated or out of send order, each reader's offsets contiguous per
partition, the group member read every acknowledged write, every awaited poll within its
documented bound, and nothing left running after ``close()``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk
from fabric.local import LocalCluster, LocalZooKeeper
from sdk.consumer import POLL_WORK_MS
from tests.fault.harness import (
    collect_replicas,
    create_replicated_topic,
    leader_of,
    read_everything,
    running_cluster,
    wait_for_full_isr,
    wait_until,
)
from tests.fault.history import History, check, producer_order

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 2_000
TOPIC, PARTITIONS = "aio-faults", 3
RATE_PER_S = 1_000.0
POLL_TIMEOUT_MS = 500
CANCELLED_POLL_SHARE = 0.25  # of the group member's polls, cut short by wait_for
PAUSE_S = 3.0  # past the session timeout: the paused leader's partitions fail over
MARGIN_S = 5.0  # on top of a documented bound: a loaded CI machine
CATCH_UP_S = 60.0  # after the faults, for the group member to read every acknowledged write


@pytest.fixture
def aio_cluster(zk_server: LocalZooKeeper, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with running_cluster(zk_server, tmp_path / "cluster", request.node.name, SESSION_TIMEOUT_MS) as cluster:
        yield cluster


def test_aio_clients_through_leader_kill_and_pause(aio_cluster: LocalCluster, seed: int) -> None:
    rng = random.Random(seed)
    bootstrap = aio_cluster.bootstrap
    create_replicated_topic(bootstrap, TOPIC, PARTITIONS)
    history = History()
    slowest_poll_s = [0.0]
    cancelled_polls = [0]

    async def run() -> list[asyncio.Task[object]]:
        client = await sdk.connect(bootstrap)
        producer = client.producer(acks="all", enable_idempotence=True, linger_ms=2)
        stop_writing = asyncio.Event()
        stop_reading = asyncio.Event()
        acks: list[asyncio.Future[object]] = []

        async def write() -> None:
            started = time.monotonic()
            i = 0
            while not stop_writing.is_set():
                value = f"w-{i}".encode()
                history.record_sent(value)
                future = producer.send(TOPIC, value, key=b"k%d" % (i % 97))
                future.add_done_callback(lambda f, v=value: history.record_ack(v, f.result().partition,
                                                                               f.result().offset))
                acks.append(future)  # type: ignore[arg-type]
                i += 1
                await asyncio.sleep(max(0.0, i / RATE_PER_S - (time.monotonic() - started)))

        async def read_all() -> None:
            consumer = await client.consumer([TOPIC], fetch_max_wait_ms=200)
            async for record in consumer:
                history.record_read("live", record.partition, record.offset, record.value or b"")

        async def read_in_group() -> None:
            member = await client.consumer([TOPIC], group_id="aio-faults", fetch_max_wait_ms=200,
                                           auto_commit_interval_ms=500)
            after_cancel = False
            while not stop_reading.is_set():
                if rng.random() < CANCELLED_POLL_SHARE:
                    cancelled_polls[0] += 1
                    after_cancel = True
                    try:
                        # Short: the poll is often cut off while it runs on the worker.
                        records = await asyncio.wait_for(member.poll(1_000), rng.uniform(0.001, 0.02))
                    except asyncio.TimeoutError:
                        continue
                else:
                    start = time.monotonic()
                    records = await member.poll(POLL_TIMEOUT_MS)
                    if not after_cancel:  # else it also waited for the cancelled poll to end on the worker
                        slowest_poll_s[0] = max(slowest_poll_s[0], time.monotonic() - start)
                    after_cancel = False
                for record in records:
                    history.record_read("group", record.partition, record.offset, record.value or b"")

        tasks = [asyncio.create_task(work()) for work in (write, read_all, read_in_group)]
        await asyncio.sleep(1.0)
        # A SIGKILL, then a SIGSTOP past the session, of a partition's leader.
        partition = rng.randrange(PARTITIONS)
        victim = await asyncio.to_thread(leader_of, bootstrap, TOPIC, partition)
        aio_cluster.nodes[victim].kill()
        await asyncio.to_thread(wait_until, lambda: leader_of(bootstrap, TOPIC, partition) not in (victim, -1),
                                "a new leader")
        aio_cluster.nodes[victim].start()
        await asyncio.to_thread(aio_cluster.wait_for_nodes, [victim])
        await asyncio.to_thread(wait_for_full_isr, bootstrap, TOPIC)
        partition = rng.randrange(PARTITIONS)
        victim = await asyncio.to_thread(leader_of, bootstrap, TOPIC, partition)
        aio_cluster.nodes[victim].pause()
        await asyncio.sleep(PAUSE_S)
        aio_cluster.nodes[victim].resume()
        await asyncio.to_thread(wait_for_full_isr, bootstrap, TOPIC)
        await asyncio.sleep(1.0)
        stop_writing.set()
        await tasks[0]
        await asyncio.gather(*acks)  # each acknowledged (a failure raises here)
        grouped = {value for _p, _o, value in history.reads["group"]}
        deadline = time.monotonic() + CATCH_UP_S
        while not history.acked.keys() <= grouped and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            grouped = {value for _p, _o, value in history.reads["group"]}
        stop_reading.set()
        await tasks[2]
        await client.close()  # ends the ``async for`` too
        await asyncio.wait_for(tasks[1], 30)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    left = asyncio.run(run())
    assert not left, f"tasks left running after close(): {left}"
    read_everything(bootstrap, TOPIC, PARTITIONS, history)
    collect_replicas(aio_cluster, TOPIC, PARTITIONS, history)
    report = check(history)
    print(f"seed={seed}: {report.summary()}; {cancelled_polls[0]} polls cancelled, slowest poll {slowest_poll_s[0]:.2f} s")
    assert report.ok(), f"reproduce with FABRIC_FAULT_SEED={seed}: {report.summary()}"
    assert not producer_order(history, "w"), producer_order(history, "w")[:3]
    missed = sorted(history.acked.keys() - {value for _p, _o, value in history.reads["group"]})
    assert not missed, f"the group member never read {len(missed)} acknowledged writes, e.g. {missed[:5]} (seed={seed})"
    # A poll returns within timeout_ms plus POLL_WORK_MS (the Consumer's docstring).
    assert slowest_poll_s[0] <= (POLL_TIMEOUT_MS + POLL_WORK_MS) / 1000 + MARGIN_S, slowest_poll_s[0]

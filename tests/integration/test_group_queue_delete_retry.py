"""The demo's queue step deletes its worker group (`fabric queue delete-group`): a leader
refuses that while a receive of the group is parked on it, as a closed worker's long poll
can be until its wait_ms ends (docs/QUEUES.md), so the demo retries, for a bounded time."""

from __future__ import annotations

import threading
import time

import pytest

from fabric import errors
from fabric.cli._queue_demo import delete_queue_group_when_idle
from fabric.local import LocalCluster
from sdk import Admin, Producer, QueueConsumer

PARKED_WAIT_MS = 3_000  # the waiting worker's long poll
PARK_SETTLE_S = 1.0  # time for that receive, once sent, to reach its leader and park there


def test_the_demo_deletes_a_group_once_its_last_long_poll_ends(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap, group = cluster.bootstrap, "workers"
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1)
    with Producer(bootstrap, linger_ms=1) as producer:
        producer.send(topic_name, b"job").result(timeout=30)
    with QueueConsumer(bootstrap, topic_name, group) as worker:  # the group exists once it received
        deadline = time.monotonic() + 30
        got = []
        while not got and time.monotonic() < deadline:
            got = worker.receive(1, 500)
        worker.ack(got)

    answered: list[int] = []
    connected = threading.Event()

    def wait_on_an_empty_queue() -> None:
        with QueueConsumer(bootstrap, topic_name, group) as waiting:
            connected.set()  # made (it looked the queue up): its receive goes out now
            answered.append(len(waiting.receive(1, PARKED_WAIT_MS)))

    waiter = threading.Thread(target=wait_on_an_empty_queue, name="parked-worker")
    waiter.start()
    try:
        assert connected.wait(timeout=30)
        time.sleep(PARK_SETTLE_S)
        with Admin(bootstrap) as admin:
            with pytest.raises(errors.GroupNotEmptyError):  # what the demo would have met
                admin.delete_queue_group(topic_name, group)
            # A bound shorter than the poll's wait gives up and says why, without raising.
            deleted, tries, refusal = delete_queue_group_when_idle(admin, topic_name, group, wait_ms=200)
            assert deleted == [] and "workers" in refusal and tries >= 1
            started = time.monotonic()
            deleted, tries, refusal = delete_queue_group_when_idle(admin, topic_name, group,
                                                                   wait_ms=PARKED_WAIT_MS + 5_000)
            assert (deleted, refusal) == ([0], "") and tries >= 2
            assert time.monotonic() - started < (PARKED_WAIT_MS + 5_000) / 1000.0
            assert group not in admin.describe_queue_groups(topic_name)
    finally:
        waiter.join(timeout=PARKED_WAIT_MS / 1000.0 + 30)
    assert not waiter.is_alive() and answered == [0]

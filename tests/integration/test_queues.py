"""Queue mode on real node processes: leases, redelivery, dead letters, delay, priority,
dedup, TTL, size limits and a leader failover (docs/QUEUES.md)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalCluster
from fabric.protocol import queues as qp
from sdk import Admin, Consumer, Producer, QueueConsumer, QueueMessage, TopicPartition

ROOT = Path(__file__).resolve().parents[2]


def _send(bootstrap: str, queue: str, values: list[bytes], **options: object) -> None:
    with Producer(bootstrap, linger_ms=1) as producer:
        futures = [producer.send(queue, v, **options) for v in values]  # type: ignore[arg-type]
        for f in futures:
            f.result(timeout=30)


def _drain(worker: QueueConsumer, count: int, timeout_s: float = 30.0, *, ack: bool = True) -> list[QueueMessage]:
    got: list[QueueMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        batch = worker.receive(min(100, count - len(got)), 500)
        got.extend(batch)
        if ack and batch:
            worker.ack(batch)
    return got


def _kill_and_wait_for_new_leader(cluster: LocalCluster, topic: str, leader: int) -> None:
    """SIGKILL partition 0's leader, then wait (up to 30 s) until another node leads it."""
    cluster.nodes[leader].kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with Admin(cluster.bootstrap) as admin:
            if admin.describe_topic(topic).partitions[0].leader not in (leader, -1):
                return
        time.sleep(0.2)


def test_competing_workers_share_and_each_group_gets_everything(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=3)
    values = [f"job-{i}".encode() for i in range(300)]
    _send(cluster.bootstrap, topic_name, values, key=None)
    a, b = QueueConsumer(cluster.bootstrap, topic_name, "workers"), QueueConsumer(cluster.bootstrap, topic_name, "workers")
    seen: dict[bytes, int] = {}
    deadline = time.monotonic() + 30
    while sum(seen.values()) < 300 and time.monotonic() < deadline:
        for worker in (a, b):
            batch = worker.receive(25, 200)
            for m in batch:
                assert m.value is not None
                seen[m.value] = seen.get(m.value, 0) + 1
            if batch:
                worker.ack(batch)
    assert set(seen) == set(values) and all(n == 1 for n in seen.values())
    other = QueueConsumer(cluster.bootstrap, topic_name, "audit")
    assert {m.value for m in _drain(other, 300)} == set(values)  # a separate group gets every message
    for w in (a, b, other):
        w.close()


WORKER = textwrap.dedent("""
    import sys, time
    from sdk import QueueConsumer
    worker = QueueConsumer(sys.argv[1], sys.argv[2], "crashy")
    while True:
        got = worker.receive(1, 1000)
        if got:
            print("GOT", got[0].offset, flush=True)
            time.sleep(3600)  # busy with the message until killed
""")


def test_worker_killed_mid_message_is_redelivered_to_another(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, visibility_timeout_ms=1500)
    _send(cluster.bootstrap, topic_name, [b"the-job"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, cluster.bootstrap, topic_name], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("GOT 0"), line
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with QueueConsumer(cluster.bootstrap, topic_name, "crashy") as other:
        got = _drain(other, 1, 15)
    assert [(m.value, m.delivery_count) for m in got] == [(b"the-job", 2)]
    assert time.monotonic() - killed_at >= 1.0  # not before the lease could end


def test_poison_message_ends_in_dead_letters_and_redrive_returns_it(cluster: LocalCluster, topic_name: str) -> None:
    dlq = f"{topic_name}.dlq"
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=2, max_deliveries=3, dead_letter=dlq)
    _send(cluster.bootstrap, topic_name, [b"poison"], key=b"k")
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        counts = []
        for _ in range(3):
            got = _drain(worker, 1, 10, ack=False)
            assert [m.value for m in got] == [b"poison"]
            counts.append(got[0].delivery_count)
            worker.nack(got, reason="cannot parse")
        assert counts == [1, 2, 3]
        assert worker.receive(10, 500) == []  # gone from the queue
        with QueueConsumer(cluster.bootstrap, dlq, "inspect") as inspect:
            dead = _drain(inspect, 1, 10, ack=False)
        assert [m.value for m in dead] == [b"poison"]
        assert dead[0].header(qp.HEADER_DLQ_QUEUE) == topic_name.encode()
        assert dead[0].header(qp.HEADER_DLQ_COUNT) == b"3"
        assert dead[0].header(qp.HEADER_DLQ_REASON) == b"cannot parse"
        with Admin(cluster.bootstrap) as admin:
            assert admin.describe_queue(topic_name).total("dead_lettered") == 1
            assert admin.redrive(topic_name) == 1
        back = _drain(worker, 1, 10)
        assert [(m.value, m.delivery_count, m.header(qp.HEADER_DLQ_QUEUE)) for m in back] == [(b"poison", 1, None)]


def test_delayed_messages_are_never_early(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name)
    delays = [100 * (i % 10 + 1) for i in range(30)]
    sent_ms = {}
    with Producer(cluster.bootstrap, linger_ms=0) as producer:
        for i, delay in enumerate(delays):
            value = f"{i}".encode()
            sent_ms[value] = int(time.time() * 1000)
            producer.send(topic_name, value, delay_ms=delay, timestamp_ms=sent_ms[value])
        producer.flush()
    late_ms = []
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        deadline = time.monotonic() + 20
        while len(late_ms) < len(delays) and time.monotonic() < deadline:
            for m in worker.receive(10, 1000):
                now_ms = int(time.time() * 1000)
                assert m.value is not None
                due = sent_ms[m.value] + delays[int(m.value)]
                assert now_ms >= due, f"message {m.value!r} delivered {due - now_ms} ms early"
                late_ms.append(now_ms - due)
                worker.ack(m)
    assert len(late_ms) == len(delays)
    print(f"delay lateness: median {statistics.median(late_ms):.0f} ms, max {max(late_ms)} ms")


def test_priority_order_under_a_backlog(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name)
    priorities = [(i * 7) % 10 for i in range(100)]
    with Producer(cluster.bootstrap, linger_ms=5) as producer:
        for i, priority in enumerate(priorities):
            producer.send(topic_name, f"{i}".encode(), priority=priority)
        producer.flush()
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        got = _drain(worker, 100)
    order = [m.priority for m in got]
    assert order == sorted(priorities, reverse=True)
    for p in range(10):  # within a priority, send order
        offsets = [m.offset for m in got if m.priority == p]
        assert offsets == sorted(offsets)


def test_dedup_within_and_after_the_window(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=3, dedup_window_ms=1500)
    _send(cluster.bootstrap, topic_name, [b"first", b"repeat", b"again"], dedup_id="order-17")
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        assert [m.value for m in _drain(worker, 1, 5)] == [b"first"]
        assert worker.receive(10, 500) == []
        time.sleep(1.6)
        _send(cluster.bootstrap, topic_name, [b"later"], dedup_id="order-17")
        assert [m.value for m in _drain(worker, 1, 5)] == [b"later"]
    with Admin(cluster.bootstrap) as admin:
        assert admin.describe_queue(topic_name).total("deduplicated") == 2


def test_size_limit_refuses_sends_until_workers_catch_up(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, max_messages=5)
    _send(cluster.bootstrap, topic_name, [f"{i}".encode() for i in range(5)])
    # Retried as the retriable error it is until the delivery timeout, which names it.
    with Producer(cluster.bootstrap, linger_ms=0, delivery_timeout_ms=1500, request_timeout_ms=1000) as producer, \
            pytest.raises(errors.DeliveryTimeoutError, match=r"QUEUE_FULL.*max_messages"):
        producer.send(topic_name, b"one too many").result(timeout=10)
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        assert len(_drain(worker, 2, 10)) >= 2
    _send(cluster.bootstrap, topic_name, [b"room again"])
    with Admin(cluster.bootstrap) as admin:
        desc = admin.describe_queue(topic_name)
    assert desc.total("visible") + desc.total("in_flight") <= 5


def test_max_bytes_counts_value_bytes_not_the_batch_frame(cluster: LocalCluster, topic_name: str) -> None:
    """max_bytes is in value bytes (docs/QUEUES.md): a 60-byte message fits an empty queue
    of max_bytes=100, though its batch frame (72-byte header, lengths, headers) does not."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, max_bytes=100)
    _send(cluster.bootstrap, topic_name, [b"x" * 60])
    with Admin(cluster.bootstrap) as admin:
        admin.describe_queue(topic_name)  # waits for the leader's first load: limits apply from then
    with Producer(cluster.bootstrap, linger_ms=0, delivery_timeout_ms=1500, request_timeout_ms=1000) as producer, \
            pytest.raises(errors.DeliveryTimeoutError, match=r"QUEUE_FULL.*max_bytes"):
        producer.send(topic_name, b"y" * 60).result(timeout=10)  # 120 value bytes: full
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        assert [m.value for m in _drain(worker, 1, 10)] == [b"x" * 60]
    _send(cluster.bootstrap, topic_name, [b"y" * 60, b"z" * 40])  # 100 value bytes: room again


def test_a_nacked_message_past_its_ttl_is_not_delivered_again(cluster: LocalCluster, topic_name: str) -> None:
    """A message whose TTL passes while leased is left to its worker; once that worker
    gives it back (nack) it is expired (dead-lettered), not handed to another worker."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, visibility_timeout_ms=10_000, dead_letter=f"{topic_name}.dlq")
    _send(cluster.bootstrap, topic_name, [b"price tick"], ttl_ms=300)
    with QueueConsumer(cluster.bootstrap, topic_name) as holder, \
            QueueConsumer(cluster.bootstrap, topic_name) as other, \
            QueueConsumer(cluster.bootstrap, f"{topic_name}.dlq") as dead:
        got = _drain(holder, 1, 5, ack=False)
        assert [m.value for m in got] == [b"price tick"]
        time.sleep(0.8)  # the TTL passes while leased (the node's timer fires meanwhile)
        holder.nack(got)
        assert other.receive(10, 1_000) == []
        letters = _drain(dead, 1, 10)
        assert [(m.value, dict(m.headers)["fabric.dlq.reason"]) for m in letters] == [(b"price tick", b"ttl expired")]


def test_expired_messages_are_not_delivered(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, message_ttl_ms=60_000)
    _send(cluster.bootstrap, topic_name, [b"short-lived"], ttl_ms=200)
    _send(cluster.bootstrap, topic_name, [b"kept"])
    time.sleep(0.4)
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        assert [m.value for m in _drain(worker, 2, 3)] == [b"kept"]
    with Admin(cluster.bootstrap) as admin:
        assert admin.describe_queue(topic_name).total("dropped") == 1


def test_extend_keeps_the_lease_and_any_topic_works_as_a_queue(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)  # a plain topic, consumed in queue mode
    _send(cluster.bootstrap, topic_name, [b"long job"])
    with QueueConsumer(cluster.bootstrap, topic_name, visibility_timeout_ms=800) as slow, \
            QueueConsumer(cluster.bootstrap, topic_name) as other:
        got = _drain(slow, 1, 5, ack=False)
        assert len(got) == 1
        slow.extend(got[0], 5_000)
        time.sleep(1.0)
        assert other.receive(10, 300) == []  # still leased to the slow worker
        with pytest.raises(errors.LeaseNotHeldError):
            other.ack(got)  # not its lease
        slow.ack(got)
        other.ack(got)  # acknowledged in the group: an ack is idempotent, whoever sends it


def test_a_lease_that_ended_while_buffered_is_not_handed_out(cluster: LocalCluster, topic_name: str) -> None:
    """A receive asks every leader, so answers beyond what one call takes wait in the
    consumer. If their leases end meanwhile, another worker gets and acks those messages:
    the first consumer must not hand them out afterwards."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=3)
    values = [f"job-{p}".encode() for p in range(3)]
    for p, value in enumerate(values):
        _send(cluster.bootstrap, topic_name, [value], partition=p)
    with QueueConsumer(cluster.bootstrap, topic_name, visibility_timeout_ms=1_000) as a, \
            QueueConsumer(cluster.bootstrap, topic_name) as b:
        assert len(a.receive(1, 5_000)) == 1  # the other leaders' answers land after this
        time.sleep(1.5)  # every lease of a's has ended
        taken = _drain(b, 3, 15)
        assert sorted(m.value for m in taken) == values  # b got all three and acked them
        assert a.receive(10, 0) == []  # nothing of a's buffer: b has acked it all


def test_bad_requests_get_clear_errors(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        with pytest.raises(errors.InvalidQueueConfigError, match="VISIBILITY_TIMEOUT_MS_MAX"):
            admin.create_queue(topic_name, visibility_timeout_ms=13 * 3_600_000)
        with pytest.raises(errors.InvalidQueueConfigError, match="max_deliveries"):
            admin.create_queue(topic_name, max_deliveries=0)
    with pytest.raises(errors.InvalidReceiveWaitError, match="RECEIVE_WAIT_MS_MAX"):
        QueueConsumer(cluster.bootstrap, topic_name).receive(1, 25_000)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        QueueConsumer(cluster.bootstrap, f"{topic_name}-missing").receive(1, 0)


def test_acked_messages_stay_acked_after_the_leader_dies(fresh_cluster: LocalCluster, topic_name: str) -> None:
    with Admin(fresh_cluster.bootstrap) as admin:
        admin.create_queue(topic_name, visibility_timeout_ms=2_000)
    values = [f"{i}".encode() for i in range(40)]
    _send(fresh_cluster.bootstrap, topic_name, values)
    worker = QueueConsumer(fresh_cluster.bootstrap, topic_name)
    acked = _drain(worker, 20, 10)[:20]
    worker.close()
    with Admin(fresh_cluster.bootstrap) as admin:
        leader = admin.describe_topic(topic_name).partitions[0].leader
    fresh_cluster.nodes[leader].kill()
    acked_values = {m.value for m in acked}
    with QueueConsumer(fresh_cluster.bootstrap, topic_name) as after:
        rest = _drain(after, 20, 30)
        rest += after.receive(100, 500)  # and nothing more
    rest_values = [m.value for m in rest]
    assert not acked_values & set(rest_values), "an acknowledged message was delivered again"
    assert acked_values | set(rest_values) == set(values), "a message was lost"


def test_a_closed_consumers_parked_polls_do_not_swallow_new_messages(cluster: LocalCluster, topic_name: str) -> None:
    """A receive asks every leader; the one answered first returns and the others' polls
    stay parked on their nodes. Messages that reach such a poll after its consumer closed
    could not be answered: they go back at once, their delivery not counted, instead of
    staying invisible for the visibility timeout (120 s here; at max_deliveries=1 they
    would then have been dropped)."""
    partitions = 6  # over 3 nodes: polls parked on more than one leader
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=partitions, visibility_timeout_ms=120_000, max_deliveries=1)
    _send(cluster.bootstrap, topic_name, [b"first"], partition=0)
    with QueueConsumer(cluster.bootstrap, topic_name) as gone:
        got = gone.receive(1, qp.RECEIVE_WAIT_MS_MAX)  # the other leaders keep its poll for 20 s
        assert [m.value for m in got] == [b"first"]
        gone.ack(got)
    for p in range(partitions):
        _send(cluster.bootstrap, topic_name, [f"after-{p}".encode()], partition=p)
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        later = _drain(worker, partitions, timeout_s=60)
    assert sorted((m.value, m.delivery_count) for m in later) == [(f"after-{p}".encode(), 1) for p in range(partitions)]


def test_the_queue_command_line(cluster: LocalCluster, topic_name: str, tmp_path: Path) -> None:
    env = {**os.environ, "FABRIC_BOOTSTRAP": cluster.bootstrap, "FABRIC_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}

    def fabric(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fabric", "queue", *args], input=stdin, env=env, text=True,
                              capture_output=True, timeout=60, check=False)

    dlq = f"{topic_name}.dlq"
    done = fabric("create", topic_name, "--partitions", "2", "--max-deliveries", "1", "--dead-letter", dlq)
    assert done.returncode == 0, done.stderr
    assert topic_name in fabric("list").stdout.split()
    assert fabric("send", topic_name, stdin="a\nb\nc\n").returncode == 0
    assert fabric("send", topic_name, "-m", "urgent", "--priority", "9").returncode == 0
    done = fabric("receive", topic_name, "-n", "4", "--wait-ms", "3000")
    assert done.returncode == 0, done.stderr
    assert sorted(line.split(": ")[1] for line in done.stdout.splitlines()) == ["a", "b", "c", "urgent"]
    described = fabric("describe", topic_name)
    assert described.returncode == 0 and "max_deliveries = 1" in described.stdout
    bad = fabric("create", f"{topic_name}-x", "--visibility-timeout-ms", "999999999")
    assert bad.returncode == 1 and "VISIBILITY_TIMEOUT_MS_MAX" in bad.stderr and "Traceback" not in bad.stderr
    assert fabric("receive", topic_name, "--wait-ms", "30000").returncode == 2  # a usage error, not a hang
    assert fabric("redrive", topic_name).stdout.strip() == f"moved 0 dead letters back to {topic_name}"
    assert fabric("send", topic_name, "-m", "waiting").returncode == 0
    status = subprocess.run([sys.executable, "-m", "fabric", "status", "--json"], env=env, text=True,
                            capture_output=True, timeout=60, check=False)
    rows = [q for q in json.loads(status.stdout)["queues"] if q["queue"] == topic_name]
    assert [(q["group"], q["visible"], q["in_flight"]) for q in rows] == [("default", 1, 0)], status.stdout
    dlq_rows = [q for q in json.loads(status.stdout)["queues"] if q["queue"] == dlq]
    assert [(q["group"], q["visible"]) for q in dlq_rows] == [("", 0)]  # nobody has read it (redrive found nothing to move)


def test_queue_depth_in_the_metrics(cluster: LocalCluster, topic_name: str) -> None:
    from tests.integration.test_metrics_endpoint import endpoints, scrape, total

    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=2)
    _send(cluster.bootstrap, topic_name, [f"{i}".encode() for i in range(30)])
    with QueueConsumer(cluster.bootstrap, topic_name) as worker:
        held = _drain(worker, 10, 10, ack=False)
        assert len(held) == 10
        urls = list(endpoints(cluster).values())
        deadline = time.monotonic() + 15
        while True:
            samples = [scrape(url) for url in urls]
            counts = {state: sum(total(s, "fabric_queue_messages", queue=topic_name, group="default", state=state)
                                 for s in samples) for state in ("visible", "in_flight", "delayed")}
            if counts == {"visible": 20, "in_flight": 10, "delayed": 0} or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert counts == {"visible": 20, "in_flight": 10, "delayed": 0}
        worker.ack(held)


def test_a_dead_letter_queue_nobody_consumes_reports_its_depth(cluster: LocalCluster, topic_name: str) -> None:
    """docs/OPERATIONS.md, "Queue depth": a queue no group reads (here a dead-letter queue)
    has depth series too, with group "", from its partitions' leaders only, without a
    describe first; deleting the queue removes them."""
    from tests.integration.test_metrics_endpoint import endpoints, scrape, total

    dlq = f"{topic_name}.dlq"
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=2, max_deliveries=1, dead_letter=dlq)
    _send(cluster.bootstrap, topic_name, [f"{i}".encode() for i in range(7)])
    with QueueConsumer(cluster.bootstrap, topic_name, "dlq-depth") as worker:
        got = _drain(worker, 7, 15, ack=False)
        assert len(got) == 7
        worker.nack(got, reason="poison")  # max_deliveries 1: each goes to the dead-letter queue
    urls = list(endpoints(cluster).values())

    def dlq_series() -> list[tuple[str, dict[str, str], float]]:
        return [(url, dict(labels), value) for url in urls for (name, labels), value in scrape(url).items()
                if name.startswith("fabric_queue_") and dict(labels).get("queue") == dlq]

    wanted = {(p, "", state) for p in ("0", "1") for state in ("visible", "in_flight", "delayed")}
    # Each partition's leader adopts it within ADOPT_INTERVAL_S (5 s) of its creation, each
    # on its own clock: the 7 messages may all be on one partition, counted before the
    # other partition's leader has adopted it.
    deadline = time.monotonic() + 15
    while True:
        series = dlq_series()
        visible = sum(v for _url, labels, v in series if labels["state"] == "visible" and labels["group"] == "")
        present = {(labels["partition"], labels["group"], labels["state"]) for _url, labels, _v in series}
        if (visible == 7 and present == wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert visible == 7, series
    # Only its depth (no finished counters: counting decides nothing), per partition from one
    # node, the partition's leader.
    assert present == wanted, series
    for partition in ("0", "1"):
        reporting = {url for url, labels, _v in series if labels["partition"] == partition}
        assert len(reporting) == 1
        leads = total(scrape(reporting.pop()), "fabric_partition_leader", topic=dlq, partition=partition)
        assert leads == 1
    with Admin(cluster.bootstrap) as admin:
        admin.delete_queue(topic_name)
        admin.delete_queue(dlq)
    deadline = time.monotonic() + 15
    while dlq_series() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert dlq_series() == []


def test_queues_from_the_asyncio_entry_point(cluster: LocalCluster, topic_name: str) -> None:
    import asyncio

    import sdk

    async def run() -> list[bytes | None]:
        async with await sdk.connect(cluster.bootstrap) as client:
            with Admin(cluster.bootstrap) as admin:
                admin.create_queue(topic_name)
            producer = client.producer()
            for i in range(3):
                await producer.send(topic_name, f"{i}".encode())
            worker = await client.queue_consumer(topic_name, group="aio")
            got: list[bytes | None] = []
            async for msg in worker:
                got.append(msg.value)
                await worker.ack(msg)
                if len(got) == 3:
                    break
            return got

    assert sorted(asyncio.run(run())) == [b"0", b"1", b"2"]  # type: ignore[type-var]


def test_an_asyncio_close_ends_a_long_receive_of_another_task(cluster: LocalCluster, topic_name: str) -> None:
    """close() from one task while another waits in receive(wait_ms=20_000): the receive
    ends with ClientClosedError at its next slice and the close returns; it waited out the
    receive's whole 20 s (asyncio fault hunt), where a threaded close() from another
    thread took milliseconds."""
    import asyncio

    from sdk.aio_queue import AsyncQueueConsumer

    async def run() -> BaseException | list[QueueMessage]:
        worker = await AsyncQueueConsumer.create(cluster.bootstrap, topic_name, "aio-close")
        waiting = asyncio.ensure_future(worker.receive(10, wait_ms=20_000))
        await asyncio.sleep(0.3)  # the receive is waiting on the worker thread
        await asyncio.wait_for(worker.close(), timeout=10)  # a bound against a hang, not a speed
        outcome: BaseException | list[QueueMessage] = (await asyncio.gather(waiting, return_exceptions=True))[0]
        return outcome

    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name)
    assert isinstance(asyncio.run(run()), errors.ClientClosedError)


def test_a_queue_cannot_be_its_own_dead_letter_queue(cluster: LocalCluster, topic_name: str) -> None:
    """Refused by the node too, not only by Admin.create_queue: a raw topic config (what a
    client written from PROTOCOL.md sends) would loop its poison messages forever."""
    with Admin(cluster.bootstrap) as admin:
        with pytest.raises(errors.InvalidQueueConfigError, match="own dead-letter"):
            admin.create_topic(topic_name, partitions=1, config={"queue": True, "dead_letter": topic_name})
        with pytest.raises(errors.InvalidQueueConfigError, match="own dead-letter"):
            admin.create_queue(topic_name, dead_letter=topic_name)
        assert topic_name not in admin.list_topics()


def test_a_loop_left_early_gives_the_rest_back_at_close(cluster: LocalCluster, topic_name: str) -> None:
    """Iteration takes one message at a time from what it received: after a ``break`` on
    the first message the others are given back by close(), so another worker gets them
    at once, not after the 30 s visibility timeout (they were leased in the same receive)."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1)
    _send(cluster.bootstrap, topic_name, [f"job-{i}".encode() for i in range(5)])
    with QueueConsumer(cluster.bootstrap, topic_name, "workers") as first:
        for msg in first:
            first.ack(msg)
            break
    with QueueConsumer(cluster.bootstrap, topic_name, "workers") as second:
        rest = _drain(second, 4, timeout_s=10)
    assert sorted(m.value for m in rest) == [f"job-{i}".encode() for i in range(1, 5)]
    assert all(m.delivery_count <= 2 for m in rest)


def test_messages_buffered_from_a_leader_that_died_are_not_handed_out(fresh_cluster: LocalCluster,
                                                                       topic_name: str) -> None:
    """A receive asks every leader, so a consumer can hold messages it has not handed out
    yet. Their leases end when their leader dies; another worker may get and ack them
    first. They used to be handed out anyway (the queue fault test saw 49 messages handled
    after another worker had acked them); now they are dropped when the node's connection
    goes, and when the consumer's map names another leader."""
    cluster = fresh_cluster
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=3)
        leaders = {p.partition: p.leader for p in admin.describe_topic(topic_name).partitions}
    with Producer(cluster.bootstrap, linger_ms=1) as producer:
        for i in range(60):
            producer.send(topic_name, f"job-{i}".encode(), partition=i % 3)
        producer.flush(30)
    with QueueConsumer(cluster.bootstrap, topic_name, "workers") as worker:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len({m.partition for m in worker._buffer}) < 3:
            worker._take_replies(0)
            if not worker._polls:
                worker._send_polls(20, 1_000)  # fill the buffer from every leader, hand nothing out
            time.sleep(0.05)
        buffered = list(worker._buffer)
        victim_partition = buffered[0].partition
        victim = leaders[victim_partition]
        dead_address = buffered[0].granted_by
        cluster.nodes[victim].kill()
        time.sleep(0.5)  # the connection drop reaches the consumer's monitor
        handed = worker.receive(1_000, 0)
        assert handed, "the other leaders' messages are still handed out"
        assert not [m for m in handed if m.granted_by == dead_address], \
            f"messages leased by the dead node {victim} were handed out"
        cluster.nodes[victim].start()


def test_a_queue_over_the_wire_gets_queue_defaults_and_a_dead_letter_queue_that_exists(
        cluster: LocalCluster, topic_name: str) -> None:
    """Found writing a client from PROTOCOL.md 5.16: CREATE_TOPIC with dead_letter naming a
    topic that did not exist was accepted, and at the queue's first poison message every
    receive of that partition failed (UNKNOWN_TOPIC, retried by the node every 200 ms)
    until someone created it; deleting a queue's dead-letter topic did the same. And a
    queue made with queue=true alone kept its messages 7 days with 8 MiB messages."""
    with Admin(cluster.bootstrap) as admin:
        with pytest.raises(errors.InvalidQueueConfigError, match="does not exist"):
            admin.create_topic(topic_name, partitions=1, config={"queue": True, "dead_letter": f"{topic_name}.dlq"})
        admin.create_topic(f"{topic_name}.dlq", partitions=1, config={"queue": True})
        admin.create_topic(topic_name, partitions=1, config={"queue": True, "dead_letter": f"{topic_name}.dlq"})
        configs = admin.describe_topic(topic_name).configs
        assert (configs["retention_ms"], configs["message_bytes_max"]) == ("-1", "1048576")
        with pytest.raises(errors.InvalidQueueConfigError, match="dead-letter queue of"):
            admin.delete_topic(f"{topic_name}.dlq")
        admin.delete_topic(topic_name)
        admin.delete_topic(f"{topic_name}.dlq")


def test_a_dead_letter_topic_is_kept_while_a_queue_just_made_names_it(cluster: LocalCluster, topic_name: str) -> None:
    """Found writing a client from PROTOCOL.md 5.16 alone: a queue created and its
    dead-letter topic deleted right after (no wait for the nodes to learn of the queue)
    was accepted, 3 tries of 3: the node checked its watched copy of the topics, which
    had not seen the queue yet. And right after a queue was deleted, deleting its
    dead-letter topic was refused for a moment. ZooKeeper itself is asked now."""
    with Admin(cluster.bootstrap) as admin:
        for i in range(5):
            queue, dlq = f"{topic_name}-{i}", f"{topic_name}-{i}.dlq"
            admin.create_topic(dlq, partitions=1, config={"queue": True})
            admin.create_topic(queue, partitions=1, config={"queue": True, "dead_letter": dlq}, wait=False)
            with pytest.raises(errors.InvalidQueueConfigError, match="dead-letter queue of"):
                admin.delete_topic(dlq, wait=False)
            admin.delete_topic(queue, wait=False)
            admin.delete_topic(dlq)  # at once: nothing names it any more


def _at_once(actions: dict[str, Callable[[], object]]) -> dict[str, BaseException]:
    """Run each action on its own thread, released together; the FabricErrors they raised."""
    start = threading.Barrier(len(actions))
    failed: dict[str, BaseException] = {}

    def run(what: str, action: Callable[[], object]) -> None:
        start.wait(10)
        try:
            action()
        except errors.FabricError as exc:
            failed[what] = exc

    threads = [threading.Thread(target=run, args=item) for item in actions.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return failed


def test_a_queue_and_the_delete_of_its_dead_letter_topic_racing_never_leave_the_queue_without_it(
        cluster: LocalCluster, topic_name: str) -> None:
    """The two ZooKeeper transactions, started together on two threads: either the queue
    exists with its dead-letter topic, or the queue was refused and the topic is gone."""
    zk = zkl.make_client(cluster.zk_address)
    zk.start(timeout=zkl.ZK_START_TIMEOUT_S)
    try:
        for i in range(12):
            queue, dlq = f"{topic_name}-{i}", f"{topic_name}-{i}.dlq"
            zkl.create_topic(zk, dlq, 1, 1, {"queue": "true"})
            failed = _at_once({
                "create": partial(zkl.create_topic, zk, queue, 1, 1, {"queue": "true", "dead_letter": dlq}),
                "delete": partial(zkl.delete_topic, zk, dlq),
            })
            there = (zk.exists(zkl.topic_path(queue)) is not None, zk.exists(zkl.topic_path(dlq)) is not None)
            assert set(failed) in ({"create"}, {"delete"}), failed
            assert all(isinstance(exc, errors.InvalidQueueConfigError) for exc in failed.values()), failed
            if "create" in failed:  # the delete won: the queue was refused
                assert there == (False, False)
            else:  # the queue won: its dead-letter topic stays
                assert there == (True, True)
                zkl.delete_topic(zk, queue)
                zkl.delete_topic(zk, dlq)
    finally:
        zkl.close_client(zk)


def test_a_receive_for_partition_minus_two_is_refused(cluster: LocalCluster, topic_name: str) -> None:
    """-1 means every partition led here; -2 was answered with an empty result (error 0)."""
    from fabric.protocol.apis import ApiKey
    from fabric.transport import Connections

    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1)
        leader = admin.nodes()[admin.describe_topic(topic_name).partitions[0].leader]
    conns = Connections()
    try:
        with pytest.raises(errors.InvalidRequestError, match="partition -2"):
            conns.request(leader, ApiKey(qp.API_QUEUE_RECEIVE), {
                "queue": topic_name, "group": "g", "consumer_id": "c", "partition": -2, "max_messages": 1,
                "wait_ms": 0, "visibility_timeout_ms": 0}, timeout_ms=10_000)
    finally:
        conns.close()


def test_bad_queue_headers_are_refused_at_send_not_changed_at_delivery(cluster: LocalCluster, topic_name: str) -> None:
    """Found writing a client from PROTOCOL.md 5.16: a PRODUCE to a queue with priority 10
    was delivered at priority 4, and one with a non-decimal delay lost all its queue
    options (its dedup id too), both acknowledged with error 0. The leader now checks a
    client's queue headers as the SDK does before sending."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1)
    cases = [([(qp.HEADER_PRIORITY, b"10")], errors.InvalidPriorityError),
             ([(qp.HEADER_DELAY_MS, b"abc"), (qp.HEADER_DEDUP_ID, b"d1")], errors.InvalidRequestError),
             ([(qp.HEADER_PRIORITY, b" 5")], errors.InvalidRequestError),
             ([(qp.HEADER_DELAY_MS, str(8 * 86_400_000).encode())], errors.InvalidDelayError),
             # a time in microseconds: it would hold its message and the log after it for ever
             ([(qp.HEADER_DELIVER_AT_MS, str(int(time.time() * 1_000_000)).encode())], errors.InvalidDelayError)]
    with Producer(cluster.bootstrap, acks="all") as producer:
        for headers, error in cases:
            with pytest.raises(error):
                producer.send(topic_name, b"bad", headers=headers).result(15)
        good = producer.send(topic_name, b"good", headers=[(qp.HEADER_PRIORITY, b"7")]).result(15)
    assert good.offset == 0  # nothing of the refused sends was written


def _log_start(bootstrap: str, topic: str) -> int:
    with Consumer(bootstrap) as consumer:
        return consumer.beginning_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]


def test_consumed_messages_are_deleted_and_the_rest_survive_a_failover(fresh_cluster: LocalCluster,
                                                                       topic_name: str) -> None:
    """The leader deletes the leading batches every group is done with (past the dedup
    window), never one holding a message some group has not finished; followers follow,
    and a new leader serves exactly what was not acknowledged."""
    bootstrap = fresh_cluster.bootstrap
    plain = f"{topic_name}-plain"
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, visibility_timeout_ms=60_000, dedup_window_ms=300, max_deliveries=1,
                           dead_letter=f"{topic_name}.dlq")
        admin.create_topic(plain, config={"dedup_window_ms": 300})  # a plain topic, read in queue mode
    _send(bootstrap, plain, [b"kept for its other readers"])
    with QueueConsumer(bootstrap, plain) as reader:
        reader.ack(_drain(reader, 1, 10, ack=False))
    values = [f"{i}".encode() for i in range(30)]
    for chunk in range(0, 30, 5):  # six batches of five
        _send(bootstrap, topic_name, values[chunk:chunk + 5])
    worker = QueueConsumer(bootstrap, topic_name)
    first = _drain(worker, 20, 20, ack=False)
    assert [m.offset for m in first] == list(range(20))
    held, poison = first[3], first[7]
    worker.nack([poison], reason="poison")  # its last delivery: dead-lettered
    worker.ack([m for m in first if m is not held and m is not poison])
    time.sleep(3)  # several trim rounds past the window: the batch holding offset 3 stays, so all do
    assert _log_start(bootstrap, topic_name) == 0
    worker.ack([held])
    deadline = time.monotonic() + 30
    while _log_start(bootstrap, topic_name) < 20 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _log_start(bootstrap, topic_name) == 20, "the acknowledged batches were not deleted"
    assert _log_start(bootstrap, plain) == 0, "a plain topic lost records to queue-mode reading"
    worker.close()
    with Admin(bootstrap) as admin:
        leader = admin.describe_topic(topic_name).partitions[0].leader
    time.sleep(1.5)  # the followers learn the leader's log start from their next fetch answers
    _kill_and_wait_for_new_leader(fresh_cluster, topic_name, leader)
    assert _log_start(bootstrap, topic_name) == 20, "a follower kept the deleted batches"
    with QueueConsumer(bootstrap, topic_name) as after:
        rest = _drain(after, 10, 30)
        rest += after.receive(100, 500)  # and nothing more
    assert sorted(m.offset for m in rest) == list(range(20, 30))
    with Admin(bootstrap) as admin:  # counted by the new leader, though its message left the log
        assert admin.describe_queue(topic_name).total("dead_lettered") == 1


def test_groups_per_queue_partition_are_bounded(cluster: LocalCluster, topic_name: str) -> None:
    """Each group keeps the state of every unfinished message of the partition, and any
    receive with a new name made one, for ever: 200 one-message consumers, each in its own
    group, took a node from 47 MB to 1.2 GB on a 20,000-message queue."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1)
    _send(cluster.bootstrap, topic_name, [b"job"])
    for n in range(qp.QUEUE_GROUPS_MAX):
        with QueueConsumer(cluster.bootstrap, topic_name, f"g{n}") as worker:
            assert [m.value for m in _drain(worker, 1)] == [b"job"]  # every group gets the message
    with QueueConsumer(cluster.bootstrap, topic_name, "one-too-many") as worker, \
            pytest.raises(errors.GroupMaxSizeReachedError, match="QUEUE_GROUPS_MAX"):
        worker.receive(1, 0)
    _send(cluster.bootstrap, topic_name, [b"later"])
    with QueueConsumer(cluster.bootstrap, topic_name, "g0") as worker:  # the groups it holds go on
        assert [m.value for m in _drain(worker, 1)] == [b"later"]


def _wait_log_start(bootstrap: str, topic: str, at_least: int, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (start := _log_start(bootstrap, topic)) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    return start


def test_deleting_a_queue_group_frees_its_room_and_refuses_a_busy_or_unknown_group(
        cluster: LocalCluster, topic_name: str, tmp_path: Path) -> None:
    """32 groups used then abandoned took every new group's room for ever; deleting one
    gives it back. A group holding a live lease is refused, as Kafka refuses to delete a
    group with members; an unknown group says so. The CLI does the same."""
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1)
    _send(bootstrap, topic_name, [b"job", b"second"])
    for n in range(qp.QUEUE_GROUPS_MAX):
        with QueueConsumer(bootstrap, topic_name, f"g{n}") as worker:
            assert len(_drain(worker, 1)) == 1
    with QueueConsumer(bootstrap, topic_name, "newcomer") as worker, pytest.raises(errors.GroupMaxSizeReachedError):
        worker.receive(1, 0)
    busy = QueueConsumer(bootstrap, topic_name, "g0", visibility_timeout_ms=60_000)
    held = _drain(busy, 1, ack=False)
    assert [m.value for m in held] == [b"second"]
    with Admin(bootstrap) as admin:
        with pytest.raises(errors.GroupNotEmptyError, match="live lease"):
            admin.delete_queue_group(topic_name, "g0")
        with pytest.raises(errors.GroupIdNotFoundError):
            admin.delete_queue_group(topic_name, "never-used")
        assert admin.delete_queue_group(topic_name, "g1") == [0]
        assert "g1" not in admin.describe_queue_groups(topic_name)
    with QueueConsumer(bootstrap, topic_name, "newcomer") as worker:  # the freed room
        assert sorted(m.value for m in _drain(worker, 2)) == [b"job", b"second"]
    busy.ack(held)
    busy.close()
    env = {**os.environ, "FABRIC_BOOTSTRAP": bootstrap, "FABRIC_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}

    def fabric(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fabric", "queue", *args], env=env, text=True,
                              capture_output=True, timeout=60, check=False)

    done = fabric("delete-group", topic_name, "g0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"deleted group g0 of queue {topic_name} (1 partition)"
    again = fabric("delete-group", topic_name, "g0")
    assert again.returncode == 1 and "GROUP_ID_NOT_FOUND" in again.stderr and "Traceback" not in again.stderr
    usage = fabric("delete-group", topic_name)
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


@pytest.mark.slow
def test_a_deleted_group_stops_holding_back_deletion_and_stays_deleted_after_a_failover(
        fresh_cluster: LocalCluster, topic_name: str) -> None:
    """An abandoned group held back the queue's deletion for ever. Once deleted, the log
    start moves; and a new leader replaying ``__queue_state`` does not bring it back: a
    32nd group still fits and the trim is still not held back."""
    bootstrap = fresh_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1, dedup_window_ms=300)
    _send(bootstrap, topic_name, [f"a{i}".encode() for i in range(5)])
    with QueueConsumer(bootstrap, topic_name, "abandoned") as worker:
        assert len(_drain(worker, 1)) == 1  # one of five finished, then never seen again
    for n in range(qp.QUEUE_GROUPS_MAX - 1):
        with QueueConsumer(bootstrap, topic_name, f"g{n}") as worker:
            assert len(_drain(worker, 5)) == 5
    with QueueConsumer(bootstrap, topic_name, "newcomer") as worker, pytest.raises(errors.GroupMaxSizeReachedError):
        worker.receive(1, 0)
    time.sleep(2)  # several trim rounds past the dedup window: held back by "abandoned"
    assert _log_start(bootstrap, topic_name) == 0
    with Admin(bootstrap) as admin:
        admin.delete_queue_group(topic_name, "abandoned")
        leader = admin.describe_topic(topic_name).partitions[0].leader
    assert _wait_log_start(bootstrap, topic_name, 5) == 5, "the deleted group still held back the deletion"
    _kill_and_wait_for_new_leader(fresh_cluster, topic_name, leader)
    _send(bootstrap, topic_name, [f"b{i}".encode() for i in range(5)])
    with QueueConsumer(bootstrap, topic_name, "newcomer") as worker:  # the 32nd group: "abandoned" stayed deleted
        got: list[QueueMessage] = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            try:
                batch = worker.receive(5, 500)
            except errors.RetriableError:
                continue  # the new leader still settling in
            got += batch
            worker.ack(batch)
        assert sorted(m.value for m in got) == [f"b{i}".encode() for i in range(5)]
    for n in range(qp.QUEUE_GROUPS_MAX - 1):
        with QueueConsumer(bootstrap, topic_name, f"g{n}") as worker:
            assert len(_drain(worker, 5)) == 5
    assert _wait_log_start(bootstrap, topic_name, 10) == 10, "a group deleted before the failover came back"
    with Admin(bootstrap) as admin:
        assert "abandoned" not in admin.describe_queue_groups(topic_name)


def test_an_idle_group_expires_after_its_retention_and_a_polling_one_does_not(
        cluster: LocalCluster, topic_name: str) -> None:
    """queue_group_retention_ms: a group with no receive, settle or live lease that long
    is deleted by the partition's leader (and stops holding back the deletion); a group
    that keeps polling, even an empty queue, is kept."""
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1, dedup_window_ms=300, group_retention_ms=2_000)
        assert admin.describe_queue(topic_name).settings["queue_group_retention_ms"] == "2000"
    _send(bootstrap, topic_name, [f"m{i}".encode() for i in range(5)])
    with QueueConsumer(bootstrap, topic_name, "idle") as worker:
        assert len(_drain(worker, 1)) == 1
    with QueueConsumer(bootstrap, topic_name, "polling") as worker:
        assert len(_drain(worker, 5)) == 5
        # Polling an empty queue for twice the retention: used, so never expired.
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert worker.receive(1, 300) == []
        assert _wait_log_start(bootstrap, topic_name, 5) == 5, "the idle group was not expired"
        with Admin(bootstrap) as admin:
            assert list(admin.describe_queue_groups(topic_name)) == ["polling"]


# A QueueConsumer's close() from another thread stops the worker thread cleanly.
#
# A developer stopped a ``for msg in worker:`` loop the only way a loop that long-polls for
# ever can be stopped, close() from another thread: the iterating thread raised a raw
# ``zmq.ZMQError('Socket operation on non-socket')`` (its sockets closed under its poll).
# Now the iteration ends as the Consumer's does at close(), ``run()`` returns, and a
# receive() caught waiting raises ClientClosedError, each within CLOSE_CHECK_INTERVAL_MS
# or so, not at the end of its long poll.
# Well under the 20 s long poll the close used to leave running (CLOSE_CHECK_INTERVAL_MS is
# 0.2 s): a busy machine's slack, not a timing claim.
STOPPED_WITHIN_S = 10.0


def _stop_from_another_thread(worker: QueueConsumer, body: Callable[[], object]) -> tuple[list[str], float]:
    """Run ``body`` on a thread until it waits, close ``worker`` from here, and return how
    the thread ended (``"returned"`` or the exception's repr) and how long the close took."""
    outcome: list[str] = []

    def target() -> None:
        try:
            body()
            outcome.append("returned")
        except BaseException as exc:  # the test reports whatever came out
            outcome.append(repr(exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    time.sleep(0.5)  # well into its long poll
    assert thread.is_alive(), outcome
    started_s = time.monotonic()
    worker.close()
    thread.join(STOPPED_WITHIN_S)
    assert not thread.is_alive(), "the worker thread did not stop"
    return outcome, time.monotonic() - started_s


@pytest.fixture
def queue(cluster: LocalCluster, topic_name: str) -> str:
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=2)
    return topic_name


def test_a_for_loop_ends_when_another_thread_closes_the_consumer(cluster: LocalCluster, queue: str) -> None:
    worker = QueueConsumer(cluster.bootstrap, queue)
    seen: list[QueueMessage] = []

    def loop() -> None:
        for msg in worker:  # an empty queue: each long poll waits 20 s
            seen.append(msg)

    outcome, close_s = _stop_from_another_thread(worker, loop)
    assert outcome == ["returned"] and seen == []
    assert close_s < STOPPED_WITHIN_S
    with pytest.raises(errors.ClientClosedError):
        worker.receive(1, 0)
    assert list(worker) == []  # iterating a closed consumer ends at once, as the Consumer's


def test_run_returns_and_a_waiting_receive_raises_client_closed(cluster: LocalCluster, queue: str) -> None:
    runner = QueueConsumer(cluster.bootstrap, queue)
    outcome, _ = _stop_from_another_thread(runner, lambda: runner.run(lambda msg: None))
    assert outcome == ["returned"]

    receiver = QueueConsumer(cluster.bootstrap, queue)
    outcome, _ = _stop_from_another_thread(receiver, lambda: receiver.receive(10, 20_000))
    assert len(outcome) == 1 and outcome[0].startswith("ClientClosedError("), outcome


def test_a_purge_settles_what_was_sent_and_a_repeated_ack_is_no_error(
        cluster: LocalCluster, topic_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """SQS's PurgeQueue and DeleteMessage, as an SQS user expects them: a second ack of a
    message is no error (it was LEASE_NOT_HELD saying the message was delivered again,
    which it never was); a purge settles every message sent before it (visible, leased,
    delayed), for groups that start later too; its dropped leases' acks succeed, an
    extend of one says it is settled, not delivered again; later messages are delivered."""
    from fabric.cli import main as fabric_main

    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, partitions=2)
    _send(bootstrap, topic_name, [b"m%d" % i for i in range(10)])
    _send(bootstrap, topic_name, [b"tomorrow"], delay_ms=86_400_000)
    with QueueConsumer(bootstrap, topic_name, visibility_timeout_ms=60_000) as worker, Admin(bootstrap) as admin:
        held = _drain(worker, 4, ack=False)
        assert len(held) == 4
        worker.ack(held[0])
        worker.ack(held[0])  # idempotent: its outcome holds
        # 3 leased, 6 visible, 1 delayed; a partition the group has not read yet counts under ""
        purged = admin.purge_queue(topic_name)
        assert sum(purged.values()) == 10 and set(purged) <= {"default", ""}, purged
        desc = admin.describe_queue(topic_name)
        assert [desc.total(k) for k in ("visible", "in_flight", "delayed", "dead_lettered", "dropped")] == [0] * 5
        worker.ack(held[1])  # a lease the purge dropped: settled, so its ack succeeds
        with pytest.raises(errors.LeaseNotHeldError) as raised:
            worker.extend(held[2], 1_000)
        assert raised.value.settled == [held[2]] and raised.value.lost == []
        assert isinstance(raised.value, errors.AlreadySettledError)  # nothing the call named comes back
        assert "already" in raised.value.message and "delivered again" not in raised.value.message.replace(
            "not delivered again", "")
        _send(bootstrap, topic_name, [b"after"])
        assert [m.value for m in _drain(worker, 1)] == [b"after"]
        assert worker.receive(10, 0) == []
        with QueueConsumer(bootstrap, topic_name, "late") as late:  # a group that starts after the purge
            assert [m.value for m in _drain(late, 1)] == [b"after"]
            assert late.receive(10, 0) == []
        assert fabric_main(["-b", bootstrap, "queue", "purge", topic_name, "--group", "late"]) == 0
        assert capsys.readouterr().out.strip() == f"purged queue {topic_name} for group late: 0 messages (group late: 0)"


def test_a_purge_counts_what_it_settled(cluster: LocalCluster, topic_name: str) -> None:
    """A purge that is a plain topic's first use in queue mode counted 0 of the messages it
    settled, and a group purged after a purge of every group counted the log below that
    purge too (which it never had: a group starts past it)."""
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
        _send(bootstrap, topic_name, [b"a", b"b", b"c"])
        assert admin.purge_queue(topic_name) == {"": 3}  # nobody reads it yet: its log is counted
        _send(bootstrap, topic_name, [b"d"])
        assert admin.purge_queue(topic_name, "newcomer") == {"newcomer": 1}
        assert admin.purge_queue(topic_name) == {"newcomer": 0}  # ("" of 0 beside a group: left out)


def test_send_batch_takes_sends_queue_options(cluster: LocalCluster, topic_name: str) -> None:
    """``send_batch`` had no priority, delay, TTL or dedup id (SQS's SendMessageBatch has
    per-entry delay and dedup ids): a per-call priority, delay_ms and ttl_ms, and one dedup
    id per record, checked before anything is queued with send's errors; a record with an
    id and no key goes where its id hashes, so its repeat meets the same dedup window."""
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, partitions=2)
    with Producer(bootstrap, linger_ms=1) as producer:
        for bad, error in (({"priority": 10}, errors.InvalidPriorityError), ({"delay_ms": -1}, errors.InvalidDelayError),
                           ({"ttl_ms": -1}, errors.InvalidRequestError),
                           ({"dedup_ids": ["x" * 129]}, errors.InvalidRequestError),
                           ({"dedup_ids": ["a", "b"]}, ValueError), ({"dedup_ids": "a"}, TypeError)):
            with pytest.raises(error):
                producer.send_batch(topic_name, [b"never"], **bad)  # type: ignore[arg-type]
        producer.send_batch(topic_name, [b"a", b"b"], dedup_ids=["id-a", None], priority=9).result(30)
        producer.send_batch(topic_name, [b"a again", b"c"], dedup_ids=["id-a", ""], ttl_ms=60_000).result(30)
        producer.send_batch(topic_name, [b"later"], delay_ms=86_400_000).result(30)
    with QueueConsumer(bootstrap, topic_name) as worker:
        got = {m.value: m for m in _drain(worker, 3)}
        assert sorted(got) == [b"a", b"b", b"c"] and worker.receive(10, 0) == []
        assert got[b"a"].priority == got[b"b"].priority == 9 and got[b"c"].header(qp.HEADER_TTL_MS) == b"60000"
    with Admin(bootstrap) as admin:
        desc = admin.describe_queue(topic_name)
        assert (desc.total("deduplicated"), desc.total("delayed"), desc.total("visible")) == (1, 1, 0)

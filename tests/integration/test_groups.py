"""Consumer groups on a real cluster: coordinator on a node, committed offsets, rebalancing."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from fabric import errors
from fabric.local import LocalCluster
from fabric.protocol import groups as gp
from sdk import Admin, Consumer, Producer, TopicPartition
from sdk._group import ConsumerRebalanceListener

FAST = {"session_timeout_ms": 6_000, "heartbeat_interval_ms": 500}


def _produce(bootstrap: str, topic: str, count: int, partitions: int, start: int = 0) -> None:
    with Producer(bootstrap, linger_ms=1) as producer:
        futures = [producer.send(topic, f"v{i}".encode(), partition=i % partitions) for i in range(start, start + count)]
        for f in futures:
            f.result(timeout=30)


def _poll_until(consumers: list[Consumer], done: Callable[[], bool], timeout_s: float = 30.0,
                sink: dict[int, list[Any]] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        for i, c in enumerate(consumers):
            records = c.poll(timeout_ms=50)
            if sink is not None:
                sink.setdefault(i, []).extend(records)


def test_commit_close_and_resume_at_committed_offset(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, replication_factor=3)
    _produce(bootstrap, topic_name, 20, 2)
    got: list[Any] = []
    with Consumer(bootstrap, group_id=f"g-{topic_name}", enable_auto_commit=False, **FAST) as c:
        c.subscribe([topic_name])
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            got.extend(c.poll(timeout_ms=200))
        assert sorted(r.value for r in got) == sorted(f"v{i}".encode() for i in range(20))
        assert set(c.assignment()) == {TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)}
        c.commit({TopicPartition(topic_name, 0): 4, TopicPartition(topic_name, 1): 10})
        assert c.committed(TopicPartition(topic_name, 0)) == 4
    # A new member of the group starts where the group committed: partition 0 at offset 4.
    again: list[Any] = []
    with Consumer(bootstrap, group_id=f"g-{topic_name}", **FAST) as c:
        c.subscribe([topic_name])
        deadline = time.monotonic() + 30
        while len(again) < 6 and time.monotonic() < deadline:
            again.extend(c.poll(timeout_ms=200))
        assert sorted((r.partition, r.offset) for r in again) == [(0, o) for o in range(4, 10)]
        time.sleep(0.2)
        assert c.poll(timeout_ms=300) == []


def test_two_then_three_members_split_partitions(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    group = f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=6, replication_factor=3)
    members = [Consumer(bootstrap, group_id=group, **FAST) for _ in range(3)]
    try:
        members[0].subscribe([topic_name])
        members[1].subscribe([topic_name])

        def split(n: int) -> bool:
            owned = [set(m.assignment()) for m in members[:n]]
            union = set().union(*owned)
            return sum(len(o) for o in owned) == 6 and len(union) == 6 and all(len(o) == 6 // n for o in owned)

        _poll_until(members[:2], lambda: split(2))
        members[2].subscribe([topic_name])
        _poll_until(members, lambda: split(3))
        with Admin(bootstrap) as admin:
            desc = admin.describe_group(group)
        assert desc.state == "stable" and len(desc.members) == 3
        # The last one leaves at close(): the other two take its partitions.
        members.pop().close()
        _poll_until(members, lambda: split(2))
    finally:
        for m in members:
            m.close()


def test_no_partition_read_by_two_members_during_rebalance(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    group = f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=6, replication_factor=3)
    _produce(bootstrap, topic_name, 600, 6)
    events: list[tuple[str, int, str, TopicPartition]] = []
    lock = threading.Lock()

    class Recorder(ConsumerRebalanceListener):
        def __init__(self, name: int) -> None:
            self.name = name

        def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
            with lock:
                events.extend((str(self.name), time.monotonic_ns(), "+", tp) for tp in assigned)  # type: ignore[misc]

        def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
            with lock:
                events.extend((str(self.name), time.monotonic_ns(), "-", tp) for tp in revoked)  # type: ignore[misc]

    members = [Consumer(bootstrap, group_id=group, **FAST) for _ in range(3)]
    seen: dict[int, list[Any]] = {}
    try:
        for i, m in enumerate(members):
            m.subscribe([topic_name], listener=Recorder(i))
            end = time.monotonic() + 1.0  # read a while before the next one joins
            _poll_until(members[: i + 1], lambda end=end: time.monotonic() > end, sink=seen)  # type: ignore[misc]
        _poll_until(members, lambda: sum(len(v) for v in seen.values()) >= 600, sink=seen)
    finally:
        for m in members:
            m.close()
    # Replay the callbacks in time order: a partition is never held by two members at once.
    holder: dict[TopicPartition, str] = {}
    for name, _t, kind, tp in sorted(events, key=lambda e: e[1]):
        if kind == "+":
            assert tp not in holder, f"{tp} given to {name} while {holder.get(tp)} held it"
            holder[tp] = name
        else:
            assert holder.pop(tp) == name
    values = sorted(r.value for rs in seen.values() for r in rs)
    assert set(values) == {f"v{i}".encode() for i in range(600)}


def test_static_member_restart_keeps_partitions(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    group = f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=4, replication_factor=3)
    # A session long enough for a restart on a loaded machine (a new consumer bootstraps
    # through ZooKeeper); the point is that the restart gets the same partitions back.
    static = {"session_timeout_ms": 20_000, "heartbeat_interval_ms": 500}
    a = Consumer(bootstrap, group_id=group, group_instance_id="host-a", **static)
    b = Consumer(bootstrap, group_id=group, group_instance_id="host-b", **static)
    try:
        a.subscribe([topic_name])
        b.subscribe([topic_name])
        _poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
        a_parts = set(a.assignment())
        b_parts = set(b.assignment())
        a.close()
        # b keeps polling for a while: it must not take a's partitions.
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            b.poll(timeout_ms=100)
        assert set(b.assignment()) == b_parts
        a = Consumer(bootstrap, group_id=group, group_instance_id="host-a", **static)
        a.subscribe([topic_name])
        _poll_until([a, b], lambda: set(a.assignment()) == a_parts)
        assert set(b.assignment()) == b_parts
    finally:
        a.close()
        b.close()


def test_pattern_subscription_picks_up_new_topic(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(f"{topic_name}.a", partitions=1, replication_factor=3)
        with Consumer(bootstrap, group_id=f"g-{topic_name}", **FAST) as c:
            c.subscribe(pattern=rf"{topic_name}\..*")
            _poll_until([c], lambda: set(c.assignment()) == {TopicPartition(f"{topic_name}.a", 0)})
            admin.create_topic(f"{topic_name}.b", partitions=2, replication_factor=3)
            want = {TopicPartition(f"{topic_name}.a", 0), TopicPartition(f"{topic_name}.b", 0),
                    TopicPartition(f"{topic_name}.b", 1)}
            _poll_until([c], lambda: set(c.assignment()) == want)
            _produce(bootstrap, f"{topic_name}.b", 4, 2)
            got: list[Any] = []
            _poll_until([c], lambda: len(got) >= 4, sink={0: got})


def test_reset_offsets_list_describe_delete(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    group = f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, replication_factor=3)
        _produce(bootstrap, topic_name, 10, 2)
        c = Consumer(bootstrap, group_id=group, **FAST)
        try:
            c.subscribe([topic_name])
            got: list[Any] = []
            _poll_until([c], lambda: len(got) >= 10, sink={0: got})
            c.commit()
            with pytest.raises(errors.GroupNotEmptyError, match="has live members: a reset is refused"):
                admin.reset_offsets(group, topic_name, to="earliest")
            with pytest.raises(errors.GroupNotEmptyError, match="has 1 live member: a reset"):  # a dry run too, as Kafka's
                admin.reset_offsets(group, topic_name, to="earliest", dry_run=True)
            with pytest.raises(errors.GroupNotEmptyError, match=r"has 1 live member$"):
                admin.delete_group(group)
            desc = admin.describe_group(group)
            assert [p.lag for p in desc.offsets] == [0, 0]
            assert group in {g.group_id for g in admin.list_groups()}
        finally:
            c.close()
        plan = admin.reset_offsets(group, topic_name, to="offset", offset=1, dry_run=True)
        assert sorted(plan.values()) == [1, 1]
        assert [p.committed for p in admin.describe_group(group).offsets] == [5, 5]  # nothing committed
        admin.reset_offsets(group, topic_name, to="earliest")
        assert [p.committed for p in admin.describe_group(group).offsets] == [0, 0]
        admin.reset_offsets(group, topic_name, to="offset", offset=2)
        assert [p.lag for p in admin.describe_group(group).offsets] == [3, 3]
        admin.reset_offsets(group, topic_name, to="latest")
        assert [p.lag for p in admin.describe_group(group).offsets] == [0, 0]
        admin.delete_group(group)
        with pytest.raises(errors.GroupIdNotFoundError):
            admin.describe_group(group)


def test_cli_consume_in_group_describe_reset_delete(cluster: LocalCluster, topic_name: str,
                                                    capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    from fabric.cli import main

    bootstrap = cluster.bootstrap
    group = f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    _produce(bootstrap, topic_name, 5, 1)
    assert main(["consume", topic_name, "-b", bootstrap, "--group", group, "--max-messages", "3"]) == 0
    assert capsysbinary.readouterr().out == b"v0\nv1\nv2\n"
    assert main(["group", "describe", group, "-b", bootstrap]) == 0
    out = capsysbinary.readouterr().out.decode()
    assert f"group {group}: empty" in out and "3            5          2" in out
    # The next member resumes after what the first one printed.
    assert main(["consume", topic_name, "-b", bootstrap, "--group", group, "--max-messages", "2"]) == 0
    assert capsysbinary.readouterr().out == b"v3\nv4\n"
    capsysbinary.readouterr()
    assert main(["group", "reset-offsets", group, "-b", bootstrap, "--topic", topic_name, "--to", "offset",
                 "--offset", "9", "--dry-run"]) == 0
    out, err = (b.decode() for b in capsysbinary.readouterr())
    assert out == f"{topic_name}/0\t5\n" and "would be set to 5" in err and "dry run, nothing committed" in err
    with Admin(bootstrap) as admin:
        assert [p.committed for p in admin.describe_group(group).offsets] == [5]
    assert main(["group", "reset-offsets", group, "-b", bootstrap, "--topic", topic_name, "--to", "offset",
                 "--offset", "1"]) == 0
    assert main(["group", "list", "-b", bootstrap]) == 0
    assert group in capsysbinary.readouterr().out.decode()
    assert main(["group", "delete", group, "-b", bootstrap]) == 0
    capsysbinary.readouterr()
    assert main(["group", "describe", group, "-b", bootstrap]) == 1  # a cluster error (usage errors are 2)
    assert b"GROUP_ID_NOT_FOUND" in capsysbinary.readouterr().err


def test_cli_consume_in_group_prints_what_consume_prints(cluster: LocalCluster, topic_name: str,
                                                          capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """--group wrote its own lines: --print-timestamp and --print-headers were dropped and
    a null key or value printed as nothing instead of --null-text (found following
    PROTOCOL.md section 13)."""
    from fabric.cli import main

    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    with Producer(bootstrap) as producer:
        producer.send(topic_name, None, key=b"k", headers=[("h", b"v"), ("n", None)], timestamp_ms=1_700_000_000_000,
                      partition=0).result(timeout=30)
        producer.send(topic_name, b"v1", timestamp_ms=1_700_000_000_001, partition=0).result(timeout=30)
    flags = ["--print-offset", "--print-timestamp", "--print-key", "--print-headers", "--null-text", "NULL"]
    assert main(["consume", topic_name, "-b", bootstrap, *flags]) == 0
    plain = capsysbinary.readouterr().out
    assert plain == b"0:0\t1700000000000\tk\th=v,n=NULL\tNULL\n0:1\t1700000000001\tNULL\t\tv1\n"
    assert main(["consume", topic_name, "-b", bootstrap, "--group", f"g-{topic_name}", "--max-messages", "2",
                 *flags]) == 0
    assert capsysbinary.readouterr().out == plain


def test_tag_filter_exact_delivery_and_bytes_saved(cluster: LocalCluster, topic_name: str,
                                                   capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    bootstrap = cluster.bootstrap
    group = f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    # One tag per batch (flush between them) so the node can skip whole batches, plus one
    # mixed batch that the node must send and the client must filter record by record, and
    # two batches where only every other record is tagged: the producer must still write
    # their bloom, or the node could never skip "some-other" (a batch without a bloom is
    # always sent), and "some-paid"'s tagged half must arrive exactly.
    plan = ["refunded", "other", "paid", "other", "mixed", "paid", "some-other", "some-paid"]
    records = 100 * len(plan)
    partial_start = 100 * plan.index("some-other")
    expected: list[bytes] = []
    sent: list[tuple[bytes, tuple[str, ...]]] = []
    with Producer(bootstrap, linger_ms=50) as producer:
        for b, tag in enumerate(plan):
            for i in range(100):
                if tag == "mixed":
                    tags: tuple[str, ...] = ("paid", "eu") if i % 2 else ("other",)
                elif tag.startswith("some-"):
                    tags = (tag[len("some-"):],) if i % 2 else ()
                else:
                    tags = (tag,)
                value = f"{b}-{i}-{'|'.join(tags)}-".encode() + os.urandom(100).hex().encode()
                producer.send(topic_name, value, partition=0, tags=tags or None)
                sent.append((value, tags))
                if "paid" in tags or "refunded" in tags:
                    expected.append(value)
            producer.flush(timeout=30)
    with Consumer(bootstrap, group_id=group, tag_filter="paid || refunded", **FAST) as c:
        c.subscribe([topic_name])
        got: list[Any] = []
        _poll_until([c], lambda: c.assignment() != [] and c.position(TopicPartition(topic_name, 0)) >= records,
                    sink={0: got})
        assert [r.value for r in got] == expected
        assert all({"paid", "refunded"} & set(r.headers[0][1].decode().split(",")) for r in got)
        c.commit()
        with capsysbinary.disabled():
            print(f"\ntag filter: {len(got)} of {records} records delivered; node left out {c.filtered_bytes:,} bytes")
        # The three "other" batches (100 records of ~220 random-ish bytes each) never crossed the wire.
        assert c.filtered_bytes >= 3 * 100 * 100
    with Admin(bootstrap) as admin:
        # The group's committed offset is past the filtered-out records: lag 0.
        assert [(p.committed, p.lag) for p in admin.describe_group(group).offsets] == [(records, 0)]
    # Only the partly tagged batches: the node skips "some-other" (FETCH v1 filtered_bytes)
    # and sends "some-paid", whose tagged half arrives, exactly.
    with Consumer(bootstrap, tag_filter="paid || refunded") as c:
        tp = TopicPartition(topic_name, 0)
        c.assign([tp])
        c.seek(tp, partial_start)
        got = []
        _poll_until([c], lambda: c.position(tp) >= records, sink={0: got})
        assert [r.value for r in got] == [v for v in expected if v.startswith(b"%d-" % plan.index("some-paid"))]
        assert len(got) == 50
        with capsysbinary.disabled():
            print(f"partly tagged batches: node left out {c.filtered_bytes:,} bytes (the half-tagged 'other' batch)")
        assert c.filtered_bytes >= 100 * 100
    # assign()-style consumers filter too; a filter with a negation is applied by the client.
    with Consumer(bootstrap, tag_filter="!other") as c:
        c.assign([TopicPartition(topic_name, 0)])
        got = []
        _poll_until([c], lambda: c.position(TopicPartition(topic_name, 0)) >= records, sink={0: got})
        assert [r.value for r in got] == [v for v, tags in sent if "other" not in tags]
    from fabric.cli import main

    capsysbinary.readouterr()
    assert main(["consume", topic_name, "-b", bootstrap, "--tags", "refunded"]) == 0
    assert capsysbinary.readouterr().out.splitlines() == [v for v in expected if b"refunded" in v]


def _commit_on_a_topic_then_delete_it(bootstrap: str, kept: str, offsets_partition: int) -> str:
    """A group (coordinated by ``offsets_partition``) commits on ``kept`` and on a second
    topic, which is then deleted: its offsets go (nodes/group_cleanup.py), ``kept``'s stay.
    They stayed for as long as the group lived, listed with an unknown lag. Returns the group."""
    idle = next(g for g in (f"idle{i}-{kept}" for i in range(10_000)) if gp.coordinator_partition(g) == offsets_partition)
    doomed = f"{kept}-doomed"
    with Admin(bootstrap) as admin:
        admin.create_topic(doomed, partitions=2, replication_factor=3)
        with Consumer(bootstrap, group_id=idle, enable_auto_commit=False) as standalone:
            offsets = {TopicPartition(kept, 0): 3, TopicPartition(doomed, 0): 1, TopicPartition(doomed, 1): 2}
            standalone.assign(list(offsets))
            standalone.commit(offsets)
        assert {o.topic for o in admin.describe_group(idle).offsets} == {kept, doomed}
        admin.delete_topic(doomed)
        deadline = time.monotonic() + 10
        while [(o.topic, o.partition, o.committed) for o in admin.describe_group(idle).offsets] != [(kept, 0, 3)]:
            assert time.monotonic() < deadline, f"the deleted topic's offsets stayed: {admin.describe_group(idle)}"
            time.sleep(0.1)
    return idle


def test_committed_offsets_and_membership_survive_coordinator_node_loss(fresh_cluster: LocalCluster,
                                                                        topic_name: str) -> None:
    """And the offsets of a topic deleted before the failover stay gone after it."""
    bootstrap = fresh_cluster.bootstrap
    group = f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=4, replication_factor=3)
    _produce(bootstrap, topic_name, 40, 4)
    # The session must outlast a node failover (ZooKeeper session 6 s + election + load):
    # a member not heard for a whole session gives its partitions up, by design.
    slow = {"session_timeout_ms": 30_000, "heartbeat_interval_ms": 500}
    a = Consumer(bootstrap, group_id=group, enable_auto_commit=False, **slow)
    b = Consumer(bootstrap, group_id=group, enable_auto_commit=False, **slow)
    try:
        a.subscribe([topic_name])
        b.subscribe([topic_name])
        _poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
        before = {c: set(c.assignment()) for c in (a, b)}
        a.commit({tp: 7 for tp in a.assignment()})
        idle = _commit_on_a_topic_then_delete_it(bootstrap, topic_name, gp.coordinator_partition(group))
        with Admin(bootstrap) as admin:
            coordinator = admin._find_coordinator(group)
            node_id = next(n for n, address in admin.nodes().items() if address == coordinator)
        fresh_cluster.nodes[node_id].kill()
        # The group carries on with a new coordinator: same members, same partitions, and
        # the commit made before the kill is there.
        deadline = time.monotonic() + 60
        while True:
            try:
                with Admin(bootstrap, request_timeout_ms=5_000) as admin:
                    if admin._find_coordinator(group) != coordinator:
                        break
            except errors.FabricError:
                pass
            assert time.monotonic() < deadline, "no new coordinator"
            time.sleep(0.5)
        end = time.monotonic() + 3.0
        _poll_until([a, b], lambda: time.monotonic() > end)
        assert {c: set(c.assignment()) for c in (a, b)} == before
        assert all(a.committed(tp) == 7 for tp in before[a])
        b.commit({tp: 9 for tp in b.assignment()})
        assert all(b.committed(tp) == 9 for tp in before[b])
        with Admin(bootstrap) as admin:  # the new coordinator loaded the tombstones
            assert [(o.topic, o.partition, o.committed) for o in admin.describe_group(idle).offsets] == [
                (topic_name, 0, 3)]
    finally:
        a.close()
        b.close()


def test_tag_filtered_poll_waits_out_its_timeout_without_spinning(cluster: LocalCluster, topic_name: str) -> None:
    """A filtered poll loops until its own deadline; a wait truncated to 0 ms used to make
    it spin through the last fraction of a millisecond of every call."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=1)
    with Consumer(cluster.bootstrap, tag_filter="paid") as c:
        c.assign([TopicPartition(topic_name, 0)])
        c.poll(timeout_ms=100)  # connected and fetching
        waits = 0
        wait_for_data = c._wait_for_data

        def counted(timeout_ms: int) -> bool:
            nonlocal waits
            waits += 1
            return wait_for_data(timeout_ms)

        c._wait_for_data = counted  # type: ignore[method-assign]
        for _ in range(20):
            assert c.poll(timeout_ms=20) == []
        assert waits <= 2 * 20, f"{waits} waits for 20 empty polls"


class _HandlerFailed(Exception):
    pass


def _first_offset_read_by_a_new_member(bootstrap: str, topic: str, group: str) -> int:
    with Consumer(bootstrap, group_id=group, **FAST) as c:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            records = c.poll(timeout_ms=200)
            if records:
                return records[0].offset
    raise AssertionError("the new member read nothing")


def test_iteration_left_by_an_exception_commits_only_finished_records(cluster: LocalCluster, topic_name: str) -> None:
    """``for record in consumer`` (the README's idiom) under auto-commit: a handler that
    raises at offset 4 of a 100-record poll must leave the group at 4, not past the whole
    poll (which skipped 96 records before). A ``break`` after finishing a record leaves it
    past that record, and the same consumer iterating again reads on from there."""
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    _produce(bootstrap, topic_name, 100, 1)
    group = f"g-{topic_name}"
    with pytest.raises(_HandlerFailed), Consumer(bootstrap, group_id=group, **FAST) as c:
        c.subscribe([topic_name])
        for record in c:
            if record.offset == 4:
                raise _HandlerFailed  # while handling offset 4: 0..3 are done
    assert _first_offset_read_by_a_new_member(bootstrap, topic_name, group) == 4

    seen: list[int] = []
    with Consumer(bootstrap, group_id=f"{group}-2", **FAST) as c:
        c.subscribe([topic_name])
        for record in c:
            seen.append(record.offset)
            if record.offset == 9:
                break
        for record in c:  # the same consumer again: on from where the loop stopped
            seen.append(record.offset)
            if record.offset == 11:
                break
        c.commit()  # positions: the records finished
        assert c.position(TopicPartition(topic_name, 0)) == 11
    assert seen == [*range(10), 9, 10, 11]  # the record being handled at a break comes again
    assert _first_offset_read_by_a_new_member(bootstrap, topic_name, f"{group}-2") == 11


def test_async_iteration_commits_only_finished_records_and_close_ends_it(cluster: LocalCluster,
                                                                          topic_name: str) -> None:
    import asyncio

    import sdk

    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    _produce(bootstrap, topic_name, 100, 1)
    group = f"g-{topic_name}"

    async def run() -> tuple[list[int], bool]:
        client = await sdk.connect(bootstrap)
        consumer = await client.consumer([topic_name], group_id=group, **FAST)
        seen: list[int] = []
        try:
            async for record in consumer:
                seen.append(record.offset)
                if record.offset == 6:
                    raise _HandlerFailed
        except _HandlerFailed:
            pass
        await consumer.close()
        # Left by break, then read with poll(): on from the record being handled, though
        # the async generator's cleanup only runs later, on the loop.
        again = await client.consumer([topic_name], group_id=f"{group}-again", **FAST)
        async for record in again:
            if record.offset == 9:
                break
        polled = [r.offset for r in await again.poll(5_000)]  # the first poll, not a later one
        assert polled[:1] == [9], polled[:5]
        await again.close()
        # close() from another task ends an ``async for`` that is waiting for records.
        idle = await client.consumer([topic_name], group_id=f"{group}-idle", **FAST)
        await idle.seek_to_end()

        async def drain() -> None:
            async for _record in idle:
                pass

        task = asyncio.ensure_future(drain())
        await asyncio.sleep(1.0)
        await idle.close()
        await asyncio.wait_for(task, 10)
        await client.close()
        return seen, task.done()

    seen, ended = asyncio.run(run())
    assert seen == list(range(7)) and ended
    assert _first_offset_read_by_a_new_member(bootstrap, topic_name, group) == 6


def test_a_cancelled_async_poll_leaves_its_records_to_the_next_poll(cluster: LocalCluster, topic_name: str) -> None:
    """``asyncio.wait_for(consumer.poll(...))`` that gives up while the poll waits on the
    worker: the poll goes on there and takes what arrives, for nobody. It used to move the
    positions past those records all the same, so the next poll went on after them and the
    next commit (auto commit, close()) skipped them for good; now the next poll reads them."""
    import asyncio

    import sdk

    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    tp = TopicPartition(topic_name, 0)

    async def run() -> tuple[int, list[int]]:
        client = await sdk.connect(bootstrap)
        try:
            consumer = await client.consumer([topic_name], group_id=f"g-{topic_name}", **FAST)
            deadline = time.monotonic() + 30
            while not await consumer.assignment():
                assert time.monotonic() < deadline, "never assigned"
                await consumer.poll(200)
            polling = asyncio.ensure_future(consumer.poll(10_000))
            await asyncio.sleep(0.5)  # the poll waits for records on the worker
            polling.cancel()
            with pytest.raises(asyncio.CancelledError):
                await polling
            await asyncio.to_thread(_produce, bootstrap, topic_name, 5, 1)  # taken by the abandoned poll
            position = await consumer.position(tp)  # on the worker, behind that poll
            polled = [r.offset for r in await consumer.poll(10_000)]
            return position, polled
        finally:
            await client.close()

    position, polled = asyncio.run(run())
    assert position == 0, f"the cancelled poll's records were skipped: position {position}"
    assert polled == list(range(5)), polled


def test_unsubscribe_hands_partitions_over_and_assign_needs_it(cluster: LocalCluster, topic_name: str) -> None:
    """As Kafka's consumer: assign() while subscribed is refused (the group decides the
    partitions); unsubscribe() commits what was handed out, leaves at once (another member
    gets the partitions without waiting for a session timeout), and then assign() and a
    fresh subscribe() both work."""
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, replication_factor=3)
    _produce(bootstrap, topic_name, 10, 2)
    group = f"g-{topic_name}"
    revoked: list[TopicPartition] = []

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            revoked.extend(partitions)

    # A long session: without the leave, the second member would wait 30 s for the partitions.
    slow_expiry = {"session_timeout_ms": 30_000, "heartbeat_interval_ms": 500}
    with Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", **slow_expiry) as first, \
            Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", **slow_expiry) as second:
        first.subscribe([topic_name], listener=Listener())
        got: dict[int, list[Any]] = {}
        _poll_until([first], lambda: len(got.get(0, [])) == 10, sink=got)
        with pytest.raises(errors.InvalidRequestError, match="unsubscribe"):
            first.assign([TopicPartition(topic_name, 0)])
        first.unsubscribe()
        first_tps = [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)]
        assert first.assignment() == [] and sorted(revoked, key=str) == first_tps
        assert first.committed(TopicPartition(topic_name, 0)) + first.committed(TopicPartition(topic_name, 1)) == 10
        first.unsubscribe()  # nothing to do
        second.subscribe([topic_name])
        _poll_until([second], lambda: len(second.assignment()) == 2, timeout_s=20)
        first.assign(first_tps)
        first.seek_to_beginning()
        _poll_until([first], lambda: len(got.get(0, [])) == 20, sink=got)
        first.unsubscribe()
        assert first.assignment() == []
        first.subscribe([topic_name])  # joins again as a new member: one partition each
        _poll_until([first, second], lambda: len(first.assignment()) == 1 and len(second.assignment()) == 1,
                    timeout_s=20)
        (theirs,) = second.assignment()
        with pytest.raises(errors.FencedMemberEpochError, match="not assigned to this member"):
            first.commit({theirs: 1})  # refused by the coordinator too; said plainly here


def test_an_oversized_id_in_a_group_request_gets_an_error_not_a_dead_coordinator(
        cluster: LocalCluster, topic_name: str) -> None:
    """DELETE_GROUPS naming an empty group and a 65,535-byte invalid id: the answer, sent
    once the deletion was durable, quoted the whole id in a message field that could not
    encode it, and the exception ended the coordinator node's loop (the node died). A
    heartbeat with such a member id got UNKNOWN_SERVER_ERROR. Messages are now cut at
    1,024 bytes as in every other response."""
    from fabric.protocol.apis import ApiKey
    from fabric.transport import Connections

    group = f"big-id-{topic_name}"
    Admin(cluster.bootstrap).create_topic(topic_name, partitions=1, replication_factor=3)
    with Consumer(cluster.bootstrap, group_id=group) as operator:
        operator.commit({TopicPartition(topic_name, 0): 1})  # an empty group with an offset
    with Admin(cluster.bootstrap) as admin:
        coordinator = admin._find_coordinator(group)
    huge = "x" * 65_535
    conns = Connections()
    try:
        heartbeat = conns.request(coordinator, ApiKey.CONSUMER_GROUP_HEARTBEAT, {
            "group_id": group, "member_id": huge, "member_epoch": 3, "instance_id": "", "session_timeout_ms": 45_000,
            "subscribed_topics": [topic_name], "subscribed_topic_regex": "", "owned": []}, timeout_ms=10_000)
        assert heartbeat.body["error"] == errors.UnknownMemberIdError.code, heartbeat.body["message"][:200]
        deleted = conns.request(coordinator, ApiKey.DELETE_GROUPS, {"group_ids": [group, huge]}, timeout_ms=10_000)
        codes = [(r["group_id"] == group, r["error"]) for r in deleted.body["results"]]
        assert codes == [(True, 0), (False, errors.InvalidGroupIdError.code)]
        assert all(len(r["message"].encode()) <= 1_024 for r in deleted.body["results"])
        time.sleep(0.5)  # the node answered from a duty of its loop; it is still serving
        assert conns.request(coordinator, ApiKey.API_VERSIONS, {}, timeout_ms=10_000).body
    finally:
        conns.close()


def test_a_topic_created_again_does_not_inherit_the_deleted_ones_committed_offsets(
        cluster: LocalCluster, topic_name: str) -> None:
    """A group committed offset 5 on a topic that was then deleted and created again under
    the same name: the group resumed the new topic at offset 5 and silently skipped its
    first five records (Kafka drops a deleted topic's committed offsets)."""
    group = f"{topic_name}-g"

    def consume(count: int) -> list[bytes]:
        got: list[bytes] = []
        with Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest", **FAST) as consumer:
            consumer.subscribe([topic_name])
            _poll_until([consumer], lambda: len(got) >= count, sink={0: got})  # type: ignore[dict-item]
            consumer.commit()
        return [r.value for r in got]

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    _produce(cluster.bootstrap, topic_name, 5, 1)
    assert consume(5) == [f"v{i}".encode() for i in range(5)]
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topic(topic_name)
        admin.create_topic(topic_name, partitions=1)
        assert admin.describe_group(group).offsets == ()  # `fabric group describe` showed the old commit
    _produce(cluster.bootstrap, topic_name, 8, 1, start=100)
    assert consume(8) == [f"v{i}".encode() for i in range(100, 108)]


def test_a_refused_commit_does_not_make_a_group(cluster: LocalCluster, topic_name: str) -> None:
    """An OFFSET_COMMIT whose every partition was refused (an unknown member, an unknown
    topic) stored an empty group in the coordinator's memory: DESCRIBE_GROUPS answered it
    `empty` instead of GROUP_ID_NOT_FOUND and LIST_GROUPS listed it, until the coordinator
    next reloaded (nothing had been written)."""
    from fabric.protocol.apis import ApiKey
    from fabric.transport import Connections

    group = f"refused-{topic_name}"
    Admin(cluster.bootstrap).create_topic(topic_name, partitions=1, replication_factor=3)
    with Consumer(cluster.bootstrap, group_id=f"{group}-warm") as warm:  # offsets topic made and loaded
        warm.commit({TopicPartition(topic_name, 0): 0})
    with Admin(cluster.bootstrap) as admin:
        coordinator = admin._find_coordinator(group)
    conns = Connections()
    try:
        for member_id, topic in (("no-such-member", topic_name), ("", f"{topic_name}-missing")):
            body = {"group_id": group, "member_id": member_id, "member_epoch": 1,
                    "offsets": [{"topic": topic, "partition": 0, "offset": 1, "metadata": ""}]}
            deadline = time.monotonic() + 30
            while True:
                try:
                    committed = conns.request(coordinator, ApiKey.OFFSET_COMMIT, body, timeout_ms=10_000)
                    break
                except errors.CoordinatorLoadInProgressError:  # its partition may still be loading
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            assert committed.body["error"] == 0
            assert committed.body["results"][0]["error"] in (
                errors.UnknownMemberIdError.code, errors.UnknownTopicOrPartitionError.code)
        described = conns.request(coordinator, ApiKey.DESCRIBE_GROUPS, {"group_ids": [group]}, timeout_ms=10_000)
        assert described.body["groups"][0]["error"] == errors.GroupIdNotFoundError.code
        listed = conns.request(coordinator, ApiKey.LIST_GROUPS, {}, timeout_ms=10_000)
        assert group not in [g["group_id"] for g in listed.body["groups"]]
    finally:
        conns.close()


_SLOW_RECORDS = 40
_SLOW_HANDLER_S = 0.25  # 40 x 0.25 s = 10 s of handling for one poll, against a 6 s session


class _LostRecorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.lost: list[list[TopicPartition]] = []

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        self.lost.append(lost)


def _other_member(bootstrap: str, group: str, topic: str, stop: threading.Event, got: list[int]) -> None:
    """A second member, polling on its own thread until ``stop``: what it gets, it reads."""
    with Consumer(bootstrap, group_id=group, **FAST) as c:
        c.subscribe([topic])
        while not stop.is_set():
            got.extend(r.offset for r in c.poll(timeout_ms=100))


def test_a_slow_iterating_member_keeps_its_session_and_no_other_member_reads_its_partition(
        cluster: LocalCluster, topic_name: str) -> None:
    """``for record in consumer`` hands one poll's records (up to 10,000) out one at a time.
    It used to heartbeat only when it polled again, so a handler slower than the session over
    one poll (here 10 s against 6 s) had the member expired while it went on handing out the
    partition's records, and the other member, given the partition, read them at the same
    time (from 0: nothing had been auto-committed). Now the iterator heartbeats (and auto
    commits) between records when due, as a poll does: the member keeps its partition."""
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    _produce(bootstrap, topic_name, _SLOW_RECORDS, 1)
    group = f"g-{topic_name}"
    listener = _LostRecorder()
    other_got: list[int] = []
    stop = threading.Event()
    other = threading.Thread(target=_other_member, args=(bootstrap, group, topic_name, stop, other_got))
    handled: list[int] = []
    got_while_held: list[int] = []
    try:
        with Consumer(bootstrap, group_id=group, **FAST) as slow:
            slow.subscribe([topic_name], listener=listener)
            for record in slow:
                if other.ident is None:
                    other.start()  # joins while this member holds the only partition
                handled.append(record.offset)
                time.sleep(_SLOW_HANDLER_S)
                if record.offset == _SLOW_RECORDS - 1:
                    got_while_held.extend(other_got)  # see _held_then_left
                    break
    finally:
        stop.set()
        if other.ident is not None:
            other.join(30)
    assert handled == list(range(_SLOW_RECORDS))
    assert listener.lost == []
    _held_then_left(got_while_held, other_got)


def _held_then_left(got_while_held: list[int], other_got: list[int]) -> None:
    """Nothing went to the other member while the slow one held the partition. Once it
    leaves (``break`` and close), the other member may get the last record: a loop left by
    ``break`` commits only the records finished before the one it was handling, which is
    read again by the next owner (at least once, never skipped). CI once saw the other
    member read record 39 in the moment between the close and the test's stop."""
    assert got_while_held == []
    assert other_got in ([], [_SLOW_RECORDS - 1]), other_got


def test_a_slow_async_iterating_member_keeps_its_session(cluster: LocalCluster, topic_name: str) -> None:
    """The asyncio consumer's ``async for``, as the test above: it heartbeats between records
    (on its worker thread), so a slow handler keeps the partition from the other member."""
    import asyncio

    import sdk

    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    _produce(bootstrap, topic_name, _SLOW_RECORDS, 1)
    group = f"g-{topic_name}"
    other_got: list[int] = []
    stop = threading.Event()
    other = threading.Thread(target=_other_member, args=(bootstrap, group, topic_name, stop, other_got))
    got_while_held: list[int] = []

    async def run() -> list[int]:
        client = await sdk.connect(bootstrap)
        consumer = await client.consumer([topic_name], group_id=group, **FAST)
        handled: list[int] = []
        try:
            async for record in consumer:
                if other.ident is None:
                    other.start()
                handled.append(record.offset)
                await asyncio.sleep(_SLOW_HANDLER_S)
                if record.offset == _SLOW_RECORDS - 1:
                    got_while_held.extend(other_got)  # see _held_then_left
                    break
        finally:
            await consumer.close()
            await client.close()
        return handled

    try:
        handled = asyncio.run(run())
    finally:
        stop.set()
        if other.ident is not None:
            other.join(30)
    assert handled == list(range(_SLOW_RECORDS))
    _held_then_left(got_while_held, other_got)


def test_a_revoked_hook_that_raises_at_close_still_leaves_and_closes(cluster: LocalCluster, topic_name: str) -> None:
    """The listener's exception comes out of close(), as documented, but only after the
    member has left and the sockets are closed: it used to escape before both, so the
    member kept its partitions until its session timed out and the consumer stayed open."""
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    _produce(bootstrap, topic_name, 3, 1)
    group = f"g-{topic_name}"

    class Failing(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            raise ValueError("the application's own failure")

    member = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", session_timeout_ms=30_000)
    member.subscribe([topic_name], listener=Failing())
    got: dict[int, list[Any]] = {}
    _poll_until([member], lambda: len(got.get(0, [])) == 3, sink=got)
    with pytest.raises(ValueError, match="own failure"):
        member.close()
    with pytest.raises(errors.ClientClosedError):
        member.poll(timeout_ms=0)
    with Admin(bootstrap) as admin:  # left at once: no member waits out the 30 s session
        assert admin.describe_group(group).members == ()

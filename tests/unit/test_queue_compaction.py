"""Compaction of ``__queue_state`` (nodes/queue_snapshot.py): a queue partition's snapshot,
read after the data log, rebuilds the state its whole history of records rebuilds, also
when the history below the snapshot is deleted and when a crash cut the snapshot short;
and the trimmer deletes only below the oldest complete snapshot of a live writer.

No sockets: a writer's share state is driven with an injected clock, its records are kept
as the coordinator would write them, and a loader is replayed from them as a new leader
would (records first, then the data log)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from fabric import zk as zkl
from fabric.protocol import queues as qp
from nodes.queue_share import Group, SharePartition
from nodes.queue_snapshot import (
    SNAPSHOT_AFTER_RECORDS_MIN,
    SNAPSHOT_HEADER,
    SNAPSHOT_INTERVAL_S,
    StateLogIndex,
    load_record,
    runs,
    snapshot_due,
    snapshot_records,
    split_writes,
)
from nodes.queue_state import ACKED, DEAD, LEASED

GROUP = "workers"
INCARNATION = b"7"
Record = tuple[int, bytes, bytes, list[tuple[str, bytes | None]]]  # timestamp, key, value, headers


@dataclass
class _Log:
    """The data log as a loader sees it: where it starts, and each message's options."""
    log_start_offset: int = 0
    messages: list[tuple[int, int, int, int]] = field(default_factory=list)  # timestamp, priority, visible_at, ttl


def _share(**config: str) -> SharePartition:
    settings = {"queue": "true", "visibility_timeout_ms": "1000", "max_deliveries": "3", **config}
    return SharePartition("jobs", 0, 1, zkl.TopicConfig.build(1, 1, settings, 0))


class Writer:
    """A queue partition's leader: its share state and the records it wrote, in order."""

    def __init__(self, seed: int, dead_letter: bool = True) -> None:
        self.rng = random.Random(seed)
        self.share = _share(**({"dead_letter": "jobs.dlq"} if dead_letter else {}))
        self.plog = _Log()
        self.group: Group = self.share.group(GROUP, self.plog)  # type: ignore[arg-type]
        self.now_ms = 1_000_000
        self.records: list[Record] = []
        self.snapshots = 0

    def collect(self) -> None:
        """As nodes/queue_durable.py ``_collect``: the changes as range records."""
        key = qp.state_key("jobs", 0, GROUP)
        for run in runs(self.group.state.drain_changes()):
            c = run[0]
            value = qp.encode_state_record(c.offset, c.state, c.delivery_count, c.visible_at_ms, c.reason,
                                           last_offset=run[-1].offset)
            self.records.append((self.now_ms, key, value, []))

    def step(self) -> None:
        """One random thing a queue sees: sends, receives, acks, nacks, time passing."""
        rng, state = self.rng, self.group.state
        action = rng.random()
        if action < 0.25:
            for _ in range(rng.randint(1, 20)):
                offset = len(self.plog.messages)
                message = (self.now_ms, rng.randint(0, 9), self.now_ms + rng.choice([0, 0, 0, 1500]),
                           rng.choice([0, 0, 0, 4000]))
                self.plog.messages.append(message)
                state.append(offset, message[0], priority=message[1], visible_at_ms=message[2], ttl_ms=message[3])
        elif action < 0.5:
            state.acquire(rng.choice(["a", "b"]), rng.randint(1, 15), self.now_ms)
        elif action < 0.85:
            leased = [o for o in range(state.start_offset, state.next_offset)
                      if (e := state.entry(o)) is not None and e.state == LEASED and e.deadline_ms > self.now_ms]
            for offset in rng.sample(leased, min(len(leased), rng.randint(0, 10))):
                consumer = state.entry(offset).consumer  # type: ignore[union-attr]
                roll = rng.random()
                if roll < 0.7:
                    state.ack(consumer, offset, self.now_ms)
                elif roll < 0.85:
                    state.nack(consumer, offset, self.now_ms, rng.choice([0, 700]), "poison")
                else:
                    state.unlease(consumer, offset, self.now_ms)
        else:
            self.now_ms += rng.choice([100, 400, 1100])
            state.tick(self.now_ms)
        self.collect()

    def snapshot(self, cut_after: int | None = None) -> int:
        """Write a snapshot (or, ``cut_after``, only its first records: a crash); where it starts."""
        start = len(self.records)
        self.snapshots += 1
        records = snapshot_records(self.share, self.plog.log_start_offset, b"s%d" % self.snapshots, self.now_ms)
        self.records += records if cut_after is None else records[:cut_after]
        return start


def rebuild(writer: Writer, records: list[Record], now_ms: int) -> Group:
    """A new leader: read the records, then replay the data log, as nodes/queue_share.py does."""
    share, plog = _share(dead_letter="jobs.dlq"), writer.plog
    prefix = qp.state_key("jobs", 0, "")
    for timestamp, key, value, headers in records:
        load_record(share, plog, key[len(prefix):].decode(), qp.decode_state_record(value),  # type: ignore[arg-type]
                    headers, timestamp)
    share.loaded()
    g = share.group(GROUP, plog)  # type: ignore[arg-type]
    for offset in range(plog.log_start_offset, len(plog.messages)):
        timestamp, priority, visible_at, ttl = plog.messages[offset]
        g.state.append(offset, timestamp, priority=priority, visible_at_ms=visible_at, ttl_ms=ttl)
        change = g.restore.pop(offset, None)
        if change is not None:
            g.state.restore(change, now_ms)
    g.state.tick(now_ms)
    return g


def view(g: Group) -> tuple[dict[int, tuple[str, int]], dict[str, int]]:
    """What must survive: each message's state and delivery count, and the counts."""
    state = g.state
    entries = {o: (e.state, e.delivery_count) for o in range(state.start_offset, state.next_offset)
               if (e := state.entry(o)) is not None}
    counts = state.counts()
    return entries, {k: counts[k] for k in ("visible", "delayed", "dead_lettered", "dropped", "start_offset")}


def _trimmed(writer: Writer, records: list[Record]) -> list[Record]:
    """The records the trimmer keeps: those from the writer's newest complete snapshot on."""
    index = StateLogIndex(epoch=1, next_offset=0)
    for offset, (timestamp, key, value, headers) in enumerate(records):
        index.add(offset, key, timestamp, [*headers, (qp.HEADER_STATE_INCARNATION, INCARNATION)], value)
    index.next_offset = len(records)
    return records[index.floor(lambda _writer, _ms: False):]


@pytest.mark.parametrize("seed", range(40))
def test_a_log_trimmed_below_a_snapshot_rebuilds_the_same_state(seed: int) -> None:
    writer = Writer(seed)
    for i in range(400):
        writer.step()
        if i % 97 == 96:
            writer.snapshot(cut_after=writer.rng.choice([None, None, 0, 1, 2, 5]))  # some cut short by a crash
    writer.snapshot()
    for _ in range(50):
        writer.step()  # decisions after the last snapshot: written after it, they win
    later = writer.now_ms + 1  # the new leader's clock: every lease ends at the failover
    whole = view(rebuild(writer, writer.records, later))
    trimmed_records = _trimmed(writer, writer.records)
    assert len(trimmed_records) < len(writer.records)
    assert view(rebuild(writer, trimmed_records, later)) == whole
    # No dead letter counted twice or lost: the writer's, once the failover has ended its
    # leases (those at their last delivery die) and its clock has caught up (TTLs pass).
    for consumer in ("a", "b"):
        writer.group.state.release_consumer(consumer, later)
    writer.group.state.tick(later)
    assert whole[1]["dead_lettered"] == writer.group.state.dead_total


@pytest.mark.parametrize("seed", range(5))
def test_a_snapshot_cut_short_by_a_crash_changes_nothing(seed: int) -> None:
    writer = Writer(seed, dead_letter=False)
    for _ in range(300):
        writer.step()
    before = view(rebuild(writer, writer.records, writer.now_ms + 1))
    records = list(writer.records)
    length = len(snapshot_records(writer.share, 0, b"x", writer.now_ms))
    for cut in sorted({0, 1, 2, length - 1, *writer.rng.sample(range(length), min(length, 8))}):
        writer.records = records + snapshot_records(writer.share, 0, b"x", writer.now_ms)[:cut]
        assert view(rebuild(writer, writer.records, writer.now_ms + 1)) == before, f"cut after {cut} records"
        assert _trimmed(writer, writer.records) == writer.records  # no marker: nothing deleted


def test_counts_survive_the_trim_of_the_records_that_made_them() -> None:
    """Dead letters and drops whose records (and messages) are long gone still count."""
    writer = Writer(1)
    state = writer.group.state
    for offset in range(10):
        writer.plog.messages.append((writer.now_ms, 4, 0, 0))
        state.append(offset, writer.now_ms)
    for _ in range(3):  # max_deliveries 3: every message dies
        state.acquire("a", 10, writer.now_ms)
        writer.now_ms += 1001
        state.tick(writer.now_ms)
        writer.collect()
    assert state.dead_total == 10 and state.start_offset == 10
    writer.plog.log_start_offset = 10  # the data log trimmed: every group was done with them
    writer.snapshot()
    records = _trimmed(writer, writer.records)
    assert all(dict(h).get(SNAPSHOT_HEADER) for _t, _k, _v, h in records)  # only the snapshot is left
    assert view(rebuild(writer, records, writer.now_ms))[1]["dead_lettered"] == 10


def test_a_restated_group_keeps_its_idle_clock() -> None:
    writer = Writer(2)
    writer.now_ms = 1_800_000_000_000
    writer.group.used_ms = writer.now_ms - 3_600_000  # last used an hour ago
    records = snapshot_records(writer.share, 0, b"s", writer.now_ms)
    share = _share()
    for timestamp, key, value, headers in records:
        load_record(share, writer.plog, key.split(b"\0")[2].decode(), qp.decode_state_record(value),  # type: ignore[arg-type]
                    headers, timestamp)
    assert share.groups[GROUP].used_ms == writer.now_ms - 3_600_000


def test_the_snapshot_restates_only_what_the_log_does_not_say() -> None:
    writer = Writer(3)
    state = writer.group.state
    for offset in range(1000):
        writer.plog.messages.append((writer.now_ms, 4, 0, 0))
        state.append(offset, writer.now_ms)
    leases, _ = state.acquire("a", 600, writer.now_ms)
    for lease in leases[:500]:
        state.ack("a", lease.offset, writer.now_ms)
    # start 500; 100 leased (one run); 400 never delivered (nothing to say); the marker.
    records = snapshot_records(writer.share, 0, b"s", writer.now_ms)
    decoded = [qp.decode_state_record(v) for _t, _k, v, _h in records]
    assert [(r["state"], r["offset"], r["last_offset"]) for r in decoded] == [
        (qp.STATE_USED, 500, 500), (ACKED, 0, 499), (LEASED, 500, 599), (qp.STATE_DELETED, 0, 0)]


def test_the_trimmer_keeps_every_live_writer_from_its_newest_complete_snapshot() -> None:
    index = StateLogIndex(epoch=1, next_offset=100)

    def add(offset: int, queue: str, group: str, snapshot: bytes | None = None, marker: bool = False,
            incarnation: bytes = b"5", timestamp_ms: int = 0) -> None:
        headers: list[tuple[str, bytes | None]] = [(qp.HEADER_STATE_INCARNATION, incarnation)]
        if snapshot is not None:
            headers.append((SNAPSHOT_HEADER, snapshot))
        value = qp.encode_state_record(0, qp.STATE_DELETED if marker else ACKED, 0, 0, "")
        index.add(offset, qp.state_key(queue, 0, "" if marker else group), timestamp_ms, headers, value)
        index.next_offset = offset + 1

    add(100, "a", GROUP)
    add(101, "b", GROUP)
    add(102, "a", GROUP, b"1")
    add(103, "a", GROUP, b"1", marker=True)  # a's complete snapshot starts at 102
    add(104, "b", GROUP, b"9")  # b's snapshot, cut short: b still starts at 101
    assert index.floor(lambda _w, _ms: False) == 101
    add(105, "b", GROUP, b"10")
    add(106, "b", GROUP, b"10", marker=True)
    assert index.floor(lambda _w, _ms: False) == 102
    add(107, "old", GROUP, incarnation=b"1")  # a deleted queue's: gone, holds nothing back
    assert index.floor(lambda writer, _ms: writer[0] == "old") == 102
    assert ("old", 0, b"1") not in index.writers
    assert StateLogIndex(epoch=1, next_offset=7).floor(lambda _w, _ms: False) == 7  # no writer: all of it


def test_the_rule_and_the_bounds() -> None:
    assert not snapshot_due(SNAPSHOT_AFTER_RECORDS_MIN - 1, 0, 0.0)
    assert snapshot_due(SNAPSHOT_AFTER_RECORDS_MIN, 0, 0.0)
    assert not snapshot_due(2 * SNAPSHOT_AFTER_RECORDS_MIN, SNAPSHOT_AFTER_RECORDS_MIN + 1, 0.0)  # a large state waits
    assert snapshot_due(0, 10, SNAPSHOT_INTERVAL_S)  # an idle queue restates now and then
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
        (0, b"k", b"v" * 100, []) for _ in range(25)]
    writes = split_writes(records, records_max=10, bytes_max=500)
    assert [len(w) for w in writes] == [3] * 8 + [1]  # 136 bytes each: 3 fit in 500
    assert [r for w in writes for r in w] == records
    assert [len(w) for w in split_writes(records, records_max=10)] == [10, 10, 5]


def test_an_unreadable_snapshot_count_counts_nothing() -> None:
    writer = Writer(4)
    records = snapshot_records(writer.share, 0, b"s", writer.now_ms)
    t, _key, v, headers = records[0]
    bad = [(name, b"lots" if name != SNAPSHOT_HEADER else value) for name, value in headers]
    share = _share()
    load_record(share, writer.plog, GROUP, qp.decode_state_record(v), bad, t)  # type: ignore[arg-type]
    share.loaded()
    assert share.groups[GROUP].state.dead_total == 0


def test_dead_is_done() -> None:
    """The trimmed rebuild relies on a restated dead message staying done."""
    writer = Writer(5)
    state = writer.group.state
    writer.plog.messages.append((writer.now_ms, 4, 0, 0))
    state.append(0, writer.now_ms)
    for _ in range(3):
        state.acquire("a", 1, writer.now_ms)
        writer.now_ms += 1001
        state.tick(writer.now_ms)
    assert state.counts()["dead_lettered"] == 1
    writer.collect()
    g = rebuild(writer, writer.records[-1:] + snapshot_records(writer.share, 0, b"s", writer.now_ms), writer.now_ms)
    assert g.state.entry(0) is None and g.state.dead_total == 1 and g.state.start_offset == 1
    assert DEAD == "dead"


@pytest.mark.parametrize(("seed", "snapshot_after"), [(4, False), (5, True), (6, True)])
def test_a_purge_survives_a_new_leader_with_or_without_a_snapshot(seed: int, snapshot_after: bool) -> None:
    """QUEUE_PURGE's records (nodes/queue_purge.py): the group's ``purged`` record and the
    partition's floor (group ""), read back by a new leader from the whole log or from a
    snapshot: nothing below the purge's end comes back, dead letters before it still count,
    a message sent after it is delivered, and a group that starts later begins past it."""
    writer = Writer(seed)
    for _ in range(150):
        writer.step()
    state = writer.group.state
    end = len(writer.plog.messages) + 2  # two more appended before the purge, not read by the group yet
    dead_before = state.dead_total
    writer.share.purge(writer.group, end)
    writer.share.purge_floor = end
    writer.records.append((writer.now_ms, qp.state_key("jobs", 0, GROUP),
                           qp.encode_state_record(end, qp.STATE_PURGED, 0, 0, ""), []))
    writer.records.append((writer.now_ms, qp.state_key("jobs", 0, ""),
                           qp.encode_state_record(end, qp.STATE_PURGED, 0, 0, ""), []))
    for offset in range(end - 2, end + 1):  # the two, then one sent after the purge
        writer.plog.messages.append((writer.now_ms, 4, 0, 0))
        state.append(offset, writer.now_ms)
    writer.collect()
    if snapshot_after:
        writer.snapshot()
    records = _trimmed(writer, writer.records) if snapshot_after else writer.records
    later = writer.now_ms + 1
    rebuilt = rebuild(writer, records, later)
    _entries, counts = view(rebuilt)
    assert counts["start_offset"] == end and counts["visible"] == 1 and counts["delayed"] == 0
    assert counts["dead_lettered"] == dead_before
    assert rebuilt.state.finished(end - 1) == ACKED and rebuilt.state.finished(end) == ""
    share = _share(dead_letter="jobs.dlq")  # the floor, read back: a group that starts later
    for timestamp, key, value, headers in records:
        load_record(share, writer.plog, key.split(b"\0")[2].decode(), qp.decode_state_record(value),  # type: ignore[arg-type]
                    headers, timestamp)
    assert share.purge_floor == end
    late = share.group("late", writer.plog)  # type: ignore[arg-type]
    for offset in range(len(writer.plog.messages)):
        late.state.append(offset, writer.now_ms)
    assert late.state.counts()["visible"] == 1 and late.state.start_offset == end

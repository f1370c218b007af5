"""The queue lease/delivery state machine, with an injected clock (no sockets, no sleeps)."""

from __future__ import annotations

import pytest

from fabric import errors
from nodes import queue_state as qs


def fill(state: qs.ShareState, n: int, now_ms: int = 0, **kw: int) -> None:
    for _ in range(n):
        state.append(state.next_offset, now_ms, **kw)


def test_lease_ack_and_start_offset() -> None:
    s = qs.ShareState(qs.QueueConfig())
    fill(s, 3)
    leases, _ = s.acquire("w1", 2, now_ms=0)
    assert [(x.offset, x.delivery_count, x.deadline_ms) for x in leases] == [(0, 1, 30_000), (1, 1, 30_000)]
    s.ack("w1", 1, now_ms=5)
    assert s.start_offset == 0  # offset 0 still leased
    s.ack("w1", 0, now_ms=6)
    assert s.start_offset == 2
    assert s.counts()["visible"] == 1 and s.counts()["in_flight"] == 0


def test_competing_consumers_never_share_a_lease() -> None:
    s = qs.ShareState(qs.QueueConfig())
    fill(s, 4)
    a, _ = s.acquire("a", 2, 0)
    b, _ = s.acquire("b", 10, 0)
    assert {x.offset for x in a}.isdisjoint({x.offset for x in b})
    assert len(a) + len(b) == 4
    with pytest.raises(errors.LeaseNotHeldError):
        s.ack("b", a[0].offset, 1)


def test_expiry_redelivers_with_count_plus_one_and_old_holder_cannot_ack() -> None:
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=1_000))
    fill(s, 1)
    s.acquire("w1", 1, 0)
    assert s.acquire("w2", 1, 999)[0] == []  # still leased, not early
    leases, _ = s.acquire("w2", 1, 1_000)
    assert [(x.offset, x.delivery_count) for x in leases] == [(0, 2)]
    with pytest.raises(errors.LeaseNotHeldError):
        s.ack("w1", 0, 1_001)
    s.ack("w2", 0, 1_001)
    assert s.start_offset == 1


def test_extend_keeps_the_lease() -> None:
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=1_000))
    fill(s, 1)
    s.acquire("w", 1, 0)
    assert s.extend("w", 0, 900, 5_000) == 5_900
    assert s.acquire("x", 1, 2_000)[0] == []
    s.ack("w", 0, 5_899)
    with pytest.raises(errors.InvalidVisibilityTimeoutError, match="VISIBILITY_TIMEOUT_MS_MAX"):
        s.extend("w", 0, 0, qs.VISIBILITY_TIMEOUT_MS_MAX + 1)


def test_nack_with_delay_is_never_early() -> None:
    s = qs.ShareState(qs.QueueConfig())
    fill(s, 1)
    s.acquire("w", 1, 0)
    assert s.nack("w", 0, 10, delay_ms=500) is None
    assert s.counts()["delayed"] == 1
    assert s.acquire("w", 1, 509)[0] == []
    leases, _ = s.acquire("w", 1, 510)
    assert [(x.offset, x.delivery_count) for x in leases] == [(0, 2)]


def test_max_deliveries_dead_letters_with_reason() -> None:
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=100, max_deliveries=3, dead_letter="q.dlq"))
    fill(s, 2)
    now = 0
    s.acquire("w", 1, now)  # delivery 1 of offset 0
    s.nack("w", 0, now, reason="boom")
    s.acquire("w", 1, now)  # delivery 2
    now += 100  # expires
    leases, finished = s.acquire("w", 1, now)  # delivery 3 of offset 0 (priority equal, lower offset first)
    assert leases[0].offset == 0 and leases[0].delivery_count == 3 and finished == []
    done = s.nack("w", 0, now, reason="still boom")
    assert done == qs.Finished(0, qs.DEAD, 3, "still boom")
    assert s.counts()["dead_lettered"] == 1 and s.start_offset == 1


def test_expiry_at_max_deliveries_without_dlq_drops_and_counts() -> None:
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=100, max_deliveries=1))
    fill(s, 1)
    s.acquire("w", 1, 0)
    assert s.tick(100) == [qs.Finished(0, qs.DROPPED, 1, qs.REASON_EXPIRED)]
    assert s.counts()["dropped"] == 1 and s.start_offset == 1


def test_priority_order_then_offset() -> None:
    s = qs.ShareState(qs.QueueConfig())
    for p in (1, 9, 4, 9, 0):
        s.append(s.next_offset, 0, priority=p)
    leases, _ = s.acquire("w", 10, 0)
    assert [x.offset for x in leases] == [1, 3, 2, 0, 4]
    with pytest.raises(errors.InvalidPriorityError, match=r"0\.\.9"):
        s.append(s.next_offset, 0, priority=10)


def test_delayed_message_visible_exactly_at_deliver_at() -> None:
    s = qs.ShareState(qs.QueueConfig())
    at = qs.deliver_at(1_000, delay_ms=7 * 24 * 3_600_000)
    s.append(0, 1_000, visible_at_ms=at)
    s.append(1, 1_000)
    assert [x.offset for x in s.acquire("w", 5, at - 1)[0]] == [1]
    assert 0 < s.next_wakeup_ms() <= at
    assert [x.offset for x in s.acquire("w", 5, at)[0]] == [0]
    with pytest.raises(errors.InvalidDelayError, match="DELAY_MS_MAX"):
        qs.deliver_at(0, delay_ms=qs.DELAY_MS_MAX + 1)
    assert qs.deliver_at(0, deliver_at_ms=500) == 500


def test_ttl_per_message_and_per_queue() -> None:
    s = qs.ShareState(qs.QueueConfig(message_ttl_ms=1_000, dead_letter="dlq"))
    s.append(0, 0, ttl_ms=100)  # the smaller of the two applies
    s.append(1, 0)
    s.append(2, 0, ttl_ms=5_000)  # capped by the queue's 1 s
    leases, finished = s.acquire("w", 5, 100)
    assert [x.offset for x in leases] == [1, 2]
    assert finished == [qs.Finished(0, qs.DEAD, 0, qs.REASON_TTL)]
    # A leased message past its TTL is left to its worker, and expires when it comes back.
    s.nack("w", 1, 2_000)
    s.ack("w", 2, 2_000)
    assert s.tick(2_000) == [qs.Finished(1, qs.DEAD, 1, qs.REASON_TTL)]
    assert s.start_offset == 3


def test_a_message_whose_ttl_passed_while_leased_is_not_delivered_after_a_nack_or_release() -> None:
    """The node ticks while the lease runs (its timer wakes at the TTL), so the expiry waits
    for the lease's deadline; a nack or release ends the lease earlier and must not make
    the expired message visible to the next receive."""
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=10_000, dead_letter="dlq"))
    s.append(0, 0, ttl_ms=500)
    s.append(1, 0, ttl_ms=500)
    s.append(2, 0, ttl_ms=500)
    assert [x.offset for x in s.acquire("w", 3, 100)[0]] == [0, 1, 2]
    assert s.tick(600) == []  # past the TTL, still leased: left to its worker
    s.nack("w", 0, 1_000)
    s.nack("w", 1, 1_000, delay_ms=100)
    assert s.unlease("w", 2, 1_000)
    leases, finished = s.acquire("other", 10, 1_000)
    assert leases == []
    assert sorted(finished, key=lambda f: f.offset) == [
        qs.Finished(o, qs.DEAD, n, qs.REASON_TTL) for o, n in ((0, 1), (1, 1), (2, 0))]


def test_size_limits_are_retriable_backpressure() -> None:
    s = qs.ShareState(qs.QueueConfig(max_messages=2, max_bytes=100))
    s.check_room(60)
    s.append(0, 0, size_bytes=60)
    with pytest.raises(errors.QueueFullError, match="max_bytes") as e:
        s.check_room(50)
    assert e.value.retriable
    s.append(1, 0, size_bytes=10)
    with pytest.raises(errors.QueueFullError, match="max_messages"):
        s.check_room(1)
    leases, _ = s.acquire("w", 1, 0)
    s.ack("w", leases[0].offset, 0)
    s.check_room(30)  # room again once a message is done


def test_release_consumer_makes_its_leases_visible() -> None:
    s = qs.ShareState(qs.QueueConfig())
    fill(s, 2)
    s.acquire("w", 2, 0)
    assert s.release_consumer("w", 10) == []
    assert [(x.offset, x.delivery_count) for x in s.acquire("v", 5, 10)[0]] == [(0, 2), (1, 2)]


def test_unlease_gives_back_a_lease_whose_answer_never_left() -> None:
    """The node could not send the answer (the long poll's consumer had gone): the message
    is visible at once and the delivery is not counted, even at max_deliveries=1."""
    s = qs.ShareState(qs.QueueConfig(max_deliveries=1, dead_letter="q.dlq"))
    fill(s, 2)
    s.acquire("gone", 2, 0)
    s.drain_changes()
    s.unlease("gone", 0, 5)
    s.unlease("someone-else", 1, 5)  # not theirs: nothing changes
    assert [(c.offset, c.state, c.delivery_count) for c in s.drain_changes()] == [(0, qs.AVAILABLE, 0)]  # persisted
    assert s.counts()["visible"] == 1 and s.counts()["in_flight"] == 1
    assert [(x.offset, x.delivery_count) for x in s.acquire("w", 5, 5)[0]] == [(0, 1)]


def test_unlease_refuses_a_lease_that_ended() -> None:
    """QueueConsumer.close() releases what it buffered (settle action release): a lease that
    ended meanwhile is not undone (it counts as delivered, as any expired lease)."""
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=100))
    fill(s, 2)
    s.acquire("w", 2, 0)
    assert s.unlease("w", 0, 50) is True
    assert s.unlease("w", 1, 100) is False  # its lease ended at 100
    assert s.unlease("w", 0, 60) is False  # not leased any more
    assert [(x.offset, x.delivery_count) for x in s.acquire("v", 5, 100)[0]] == [(0, 1), (1, 2)]


def test_replayed_append_is_ignored() -> None:
    s = qs.ShareState(qs.QueueConfig(), start_offset=10)
    s.append(10, 0)
    s.append(10, 0)
    assert s.counts()["visible"] == 1 and s.next_offset == 11


def test_bad_config_is_refused() -> None:
    with pytest.raises(errors.InvalidVisibilityTimeoutError):
        qs.QueueConfig(visibility_timeout_ms=0)
    with pytest.raises(errors.InvalidQueueConfigError):
        qs.QueueConfig(max_deliveries=0)
    with pytest.raises(errors.InvalidReceiveWaitError, match="RECEIVE_WAIT_MS_MAX"):
        qs.check_receive_wait_ms(20_001)


def test_dedup_within_and_after_the_window() -> None:
    d = qs.DedupWindow(window_ms=1_000)
    assert d.admit("a", 0)
    assert not d.admit("a", 999)
    assert d.admit("b", 500)
    assert d.admit("a", 1_000)  # the window passed
    assert not d.admit("b", 1_499)


def test_dedup_memory_is_bounded() -> None:
    d = qs.DedupWindow(window_ms=1_000_000, ids_max=2)
    assert d.admit("a", 0) and d.admit("b", 0) and d.admit("c", 0)
    assert d.admit("a", 1)  # forgotten: the bound wins over the window


def rebuild(old: qs.ShareState, changes: list[qs.Change], now_ms: int, n: int) -> qs.ShareState:
    """What a new leader does: replay the data log, then the persisted changes (through the codec)."""
    from fabric.protocol import queues as qp

    new = qs.ShareState(old.config)
    for off in range(n):
        new.append(off, 0)
    for c in changes:
        raw = qp.encode_state_record(c.offset, c.state, c.delivery_count, c.visible_at_ms, c.reason)
        fields = qp.decode_state_record(raw)
        assert fields.pop("last_offset") == c.offset
        new.restore(qs.Change(**fields), now_ms)
    return new


def test_failover_rebuild_never_redelivers_acked_and_loses_nothing() -> None:
    s = qs.ShareState(qs.QueueConfig(max_deliveries=2, dead_letter="dlq"))
    fill(s, 6)
    log: list[qs.Change] = []
    s.acquire("w", 4, 0)  # offsets 0..3 leased
    s.ack("w", 0, 1)
    s.ack("w", 2, 1)
    s.nack("w", 1, 1, delay_ms=1_000)  # delayed until 1001, count 1
    log += s.drain_changes()
    s.acquire("w", 1, 2)  # offset 4 leased
    log += s.drain_changes()
    assert s.drain_changes() == []
    new = rebuild(s, log, now_ms=10, n=6)
    assert new.start_offset == 1
    got, _ = new.acquire("v", 10, 10)
    # 3 and 4 were leased at the crash: redelivered with their count kept +1; 5 never sent;
    # 1 stays delayed; 0 and 2 (acked) never again.
    assert sorted((x.offset, x.delivery_count) for x in got) == [(3, 2), (4, 2), (5, 1)]
    assert [x.offset for x in new.acquire("v", 10, 1_001)[0]] == [1]


def test_rebuild_keeps_dead_letters_dead() -> None:
    s = qs.ShareState(qs.QueueConfig(max_deliveries=1, dead_letter="dlq"))
    fill(s, 2)
    s.acquire("w", 1, 0)
    s.nack("w", 0, 0, reason="poison")
    new = rebuild(s, s.drain_changes(), now_ms=0, n=2)
    assert new.start_offset == 1 and new.counts()["dead_lettered"] == 1
    assert [x.offset for x in new.acquire("v", 5, 0)[0]] == [1]


def test_a_lease_on_its_last_delivery_at_failover_is_dead_lettered_not_delivered_again() -> None:
    s = qs.ShareState(qs.QueueConfig(max_deliveries=2, dead_letter="dlq"))
    fill(s, 2)
    s.acquire("w", 1, 0)
    s.nack("w", 0, 0)
    s.acquire("w", 1, 0)  # offset 0, second (last allowed) delivery, leased at the crash
    new = rebuild(s, s.drain_changes(), now_ms=5, n=2)
    got, finished = new.acquire("v", 10, 5)
    assert [x.offset for x in got] == [1]
    assert [(f.offset, f.state, f.delivery_count, f.reason) for f in finished] == [
        (0, qs.DEAD, 2, qs.REASON_EXPIRED)]


def test_state_record_codec_refuses_garbage() -> None:
    from fabric.protocol import queues as qp

    raw = bytearray(qp.encode_state_record(3, qs.ACKED, 1, 0, ""))
    raw[17] = 99  # the state byte (after version u8, offset i64, last_offset i64)
    with pytest.raises(errors.CorruptMessageError):
        qp.decode_state_record(bytes(raw))


@pytest.mark.parametrize("seed", range(5))
def test_seeded_random_workers_keep_the_invariants(seed: int) -> None:
    """Random receives, acks, nacks, extends and clock jumps: an acked or dead message is
    never leased again, and every message ends exactly once, acked or dead."""
    import random

    rng = random.Random(seed)
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=100, max_deliveries=3, dead_letter="dlq"))
    n, now = 300, 0
    fill(s, n)
    acked: set[int] = set()
    dead: set[int] = set()
    held: dict[int, str] = {}
    for _ in range(20_000):
        if len(acked) + len(dead) == n:
            break
        now += rng.choice((0, 1, 5, 50))
        worker = f"w{rng.randrange(4)}"
        leases, finished = s.acquire(worker, rng.randrange(1, 5), now)
        dead |= {f.offset for f in finished}
        for lease in leases:
            assert lease.offset not in acked and lease.offset not in dead
            held[lease.offset] = worker
        for off, w in list(held.items()):
            e = s.entry(off)
            if e is None or e.state != qs.LEASED or e.consumer != w:
                del held[off]
                continue
            roll = rng.random()
            if roll < 0.5:
                s.ack(w, off, now)
                acked.add(off)
                del held[off]
            elif roll < 0.6:
                done = s.nack(w, off, now, delay_ms=rng.choice((0, 20)))
                if done is not None:
                    dead.add(done.offset)
                del held[off]
            elif roll < 0.65:
                s.extend(w, off, now, 50)
        dead |= {f.offset for f in s.tick(now)}
        s.drain_changes()
    assert acked | dead == set(range(n)) and not acked & dead
    assert s.start_offset == n and s.counts()["bytes"] == 0


def test_acquire_is_bounded_by_bytes_but_takes_at_least_one() -> None:
    s = qs.ShareState(qs.QueueConfig())
    for off in range(5):
        s.append(off, 0, size_bytes=400)
    got, _ = s.acquire("w", 10, 0, bytes_max=1_000)
    assert [x.offset for x in got] == [0, 1]
    got, _ = s.acquire("w", 10, 0, bytes_max=100)  # larger than the bound: still one
    assert [x.offset for x in got] == [2]


def test_room_counts_unfinished_messages_and_pending_ones() -> None:
    s = qs.ShareState(qs.QueueConfig(max_messages=3, max_deliveries=1, dead_letter="dlq"))
    fill(s, 3)
    s.ack("w", s.acquire("w", 1, 0)[0][0].offset, 0)  # offset 0 done; 1 and 2 wait
    s.check_room(0, records=1)
    with pytest.raises(errors.QueueFullError, match="holds 3 messages"):
        s.check_room(0, records=1, pending=1)  # one appended but not committed yet
    leases, _ = s.acquire("w", 1, 0)
    s.nack("w", leases[0].offset, 0)  # its last delivery: dead, no longer counted
    s.check_room(0, records=1, pending=1)


def test_counts_kept_as_messages_move_match_a_full_scan() -> None:
    """counts() is kept incrementally (O(1) on a long backlog): after every step of a random
    run it equals a count over every entry."""
    import random

    rng = random.Random(7)
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=1_000, max_deliveries=3, message_ttl_ms=50_000))
    now = 0
    held: list[tuple[str, int]] = []
    for _ in range(3_000):
        now += rng.randrange(0, 300)
        step = rng.random()
        if step < 0.3:
            gap = 2 if rng.random() < 0.05 else 1  # now and then an offset that never joins
            s.append(s.next_offset + gap - 1, now, visible_at_ms=now + rng.choice([0, 0, 500]))
        elif step < 0.55:
            consumer = rng.choice("ab")
            leases, _ = s.acquire(consumer, rng.randrange(1, 4), now)
            held += [(consumer, x.offset) for x in leases]
        elif step < 0.8 and held:
            consumer, offset = held.pop(rng.randrange(len(held)))
            try:
                if rng.random() < 0.6:
                    s.ack(consumer, offset, now)
                else:
                    s.nack(consumer, offset, now, rng.choice([0, 200]))
            except errors.LeaseNotHeldError:
                pass  # expired meanwhile
        else:
            s.tick(now)
        entries = list(s._entries.values())
        counts = s.counts()
        assert counts["visible"] == sum(e.state == qs.AVAILABLE for e in entries)
        assert counts["in_flight"] == sum(e.state == qs.LEASED for e in entries)
        assert counts["delayed"] == sum(e.state == qs.DELAYED for e in entries)
        undone = [e.offset for e in entries if e.state not in (qs.ACKED, qs.DEAD, qs.DROPPED)]
        assert counts["oldest_offset"] == (min(undone) if undone else -1)


def test_trim_keeps_a_batch_holding_an_unfinished_message_and_the_dedup_window() -> None:
    """SharePartition.trim_batches: whole batches below the floor, past the dedup window
    (plus the clock slack) by their append time, which the window counts from."""
    from types import SimpleNamespace

    from fabric import zk as zkl
    from nodes.log import IndexEntry
    from nodes.queue_share import SharePartition

    window_ms = 1_000  # the slack is then the window too: a batch goes 2 s after its time
    share = SharePartition("q", 0, 1, zkl.TopicConfig(partitions=1, queue=True, dedup_window_ms=window_ms))
    entries = [IndexEntry(base, 5, 100, max_timestamp=ts, append_ms=appended, leader_epoch=1)
               for base, ts, appended in [(0, 1_000, 1_000), (5, 1_000, 1_000), (10, 1_000, 5_000), (15, 1_000, 1_000)]]
    plog = SimpleNamespace(entries=entries)
    assert share.trim_batches(plog, 20, now_ms=3_001) == 2  # [0,5) and [5,10); [10,15) appended at 5 s
    assert share.trim_batches(plog, 20, now_ms=2_999) == 0  # inside window + slack
    assert share.trim_batches(plog, 9, now_ms=10_000) == 1  # offset 9 unfinished: its batch stays
    assert share.trim_batches(plog, 20, now_ms=7_001) == 4
    # A producer clock a day ahead no longer keeps its consumed batches a day longer: the
    # dedup window counts from the append (docs/DESIGN.md, "Clocks").
    entries[0].max_timestamp = 86_400_000
    assert share.trim_batches(plog, 20, now_ms=7_001) == 4


def test_a_lease_whose_answer_has_not_left_is_not_a_delivery() -> None:
    """The coordinator answers a receive only once its leases are durable; while the
    __queue_state leader failed over that took longer than the visibility timeout, and
    the lease clock, started at acquire, ran out before the worker had the message: each
    such lease counted a delivery, and at max_deliveries the message was dead-lettered
    though no worker ever held a live lease of it (1,000 good messages in a fault run)."""
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=1_000, max_deliveries=1))
    fill(s, 2)
    leases, _ = s.acquire("w", 2, 0, unanswered=True)
    assert [x.delivery_count for x in leases] == [1, 1]
    # Offset 0's answer leaves late, at 800: its clock starts then, not at 0.
    assert s.answered("w", 0, 800) == 1_800
    # Offset 1's answer has not left when its lease would end: undone, not counted.
    assert s.tick(1_000) == []  # nothing dead, although max_deliveries is 1
    assert s.entry(1).state == qs.AVAILABLE and s.entry(1).delivery_count == 0
    assert s.answered("w", 1, 1_001) == 0  # its answer leaves it out
    assert s.entry(0).state == qs.LEASED  # the answered lease still runs
    s.ack("w", 0, 1_500)
    again, _ = s.acquire("x", 1, 1_600)
    assert [(x.offset, x.delivery_count) for x in again] == [(1, 1)]
    # Handed out at once (the default), a lease that ends counts, as before.
    assert [f.offset for f in s.tick(2_600)] == [1]


def test_an_answered_lease_takes_the_visibility_asked_for() -> None:
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=1_000))
    fill(s, 1)
    s.acquire("w", 1, 0, visibility_ms=5_000, unanswered=True)
    assert s.answered("w", 0, 300, 5_000) == 5_300
    assert s.answered("w", 0, 400, 5_000) == 0  # once only
    assert s.answered("other", 0, 300) == 0


def test_an_ack_of_an_acknowledged_message_succeeds_and_other_settles_say_already_settled() -> None:
    """An SQS user's ``ack(m); ack(m)``: the second is no error (the ack's outcome holds),
    also once the start offset passed it, and when another consumer acknowledged it after a
    redelivery. A nack, extend or release of it is refused as ALREADY_SETTLED (not
    delivered again), never as LEASE_NOT_HELD (which says it is delivered again)."""
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=1_000))
    fill(s, 3)
    s.acquire("w1", 3, 0)
    assert s.ack("w1", 1, 10) is True
    assert s.ack("w1", 1, 11) is False  # still held as an entry (offset 0 is not done)
    s.ack("w1", 0, 12)
    assert s.start_offset == 2 and s.ack("w1", 0, 13) is False  # forgotten below the start offset
    for settle in (lambda: s.nack("w1", 1, 14), lambda: s.extend("w1", 1, 14, 1_000)):
        with pytest.raises(errors.AlreadySettledError):
            settle()
    assert isinstance(s.not_held("w1", 1), errors.AlreadySettledError)
    # Offset 2: w1's lease ends, w2 gets it again and acks it: w1's late ack holds too.
    s.tick(1_500)
    (again,), _ = s.acquire("w2", 1, 1_500)
    assert again.offset == 2 and again.delivery_count == 2
    with pytest.raises(errors.LeaseNotHeldError):
        s.ack("w1", 2, 1_600)  # w2 holds it now: not settled, delivered (again) to w2
    s.ack("w2", 2, 1_600)
    assert s.ack("w1", 2, 1_700) is False
    assert s.counts()["visible"] == 0 and s.counts()["in_flight"] == 0


def test_a_late_ack_of_a_dead_lettered_message_says_so_not_delivered_again() -> None:
    s = qs.ShareState(qs.QueueConfig(visibility_timeout_ms=1_000, max_deliveries=1, dead_letter="dlq"))
    fill(s, 2)
    s.acquire("w1", 2, 0)
    s.ack("w1", 1, 5)
    s.tick(1_000)  # offset 0's only allowed lease ended: dead-lettered; the start offset passes both
    assert s.start_offset == 2
    with pytest.raises(errors.AlreadySettledError, match="given up on"):
        s.ack("w1", 0, 1_001)
    assert s.ack("w1", 1, 1_001) is False


def test_purge_settles_everything_below_the_end_and_later_messages_are_delivered() -> None:
    s = qs.ShareState(qs.QueueConfig())
    fill(s, 4)
    s.append(4, 0, visible_at_ms=60_000)  # delayed
    leases, _ = s.acquire("w1", 2, 0)
    # The log's end is 7: offsets 5 and 6 are appended but not ingested yet; purged too.
    assert s.purge(7) == 5
    s.drain_changes()
    assert s.counts()["visible"] == s.counts()["in_flight"] == s.counts()["delayed"] == 0
    assert s.ack("w1", leases[0].offset, 1) is False  # the dropped lease's ack: settled, no error
    with pytest.raises(errors.AlreadySettledError):
        s.extend("w1", leases[1].offset, 1, 1_000)
    fill(s, 3)  # 5, 6 (before the purge) and 7 (after it)
    assert s.counts()["visible"] == 1 and s.dead_total == s.dropped_total == 0
    (lease,), _ = s.acquire("w1", 10, 2)
    assert lease.offset == 7
    assert s.purge(7) == 0  # idempotent

"""Dead letters within the dead-letter topic's limits, dead-letter topics that are not
allowed, and dedup ids measured as sent: the pure parts (no node, no socket).

The live counterparts are in tests/integration/test_queue_dead_letter_limits.py."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from fabric import errors
from fabric import zk as zkl
from fabric.limits import BATCH_HEADER_BYTES
from fabric.protocol import batch as batch_format
from fabric.protocol import queues as qp
from nodes import queue_dead_letters as qd
from nodes import queue_state as qs
from nodes.queue_durable import QueueDurability, Slot
from nodes.queue_share import SharePartition, queue_config

MIB = 1024 * 1024


def _finished(offset: int, reason: str = "ttl expired") -> qs.Finished:
    return qs.Finished(offset, qs.DEAD, 1, reason)


def _letter(offset: int, value: bytes, headers: list[tuple[str, bytes | None]] | None = None) -> qd.Letter:
    record = (1_700_000_000_000 + offset, None, value, headers or [])
    return qd.dead_letter("jobs", 0, _finished(offset), record)


def _write_all(letters: list[qd.Letter | None], limit_bytes: int) -> tuple[list[bytes], list[int]]:
    """Every write ``_dead_letter`` makes of ``letters``: the frames, and the indices dropped."""
    frames: list[bytes] = []
    dropped: list[int] = []
    start = 0
    while start < len(letters):
        taken, written, unfit = qd.next_dead_letter_write(letters[start:], limit_bytes)
        assert taken >= 1  # always progress: a letter that never fits does not hold the rest
        chunk = [x for i in written if (x := letters[start + i]) is not None]
        if chunk:
            frames.append(qd.encode_letters(chunk, limit_bytes))  # what _produce sends
        dropped.extend(start + i for i in unfit)
        start += taken
    return frames, dropped


def test_thirty_large_dead_letters_are_written_in_batches_the_topic_takes() -> None:
    """The reported case: 30 random 100 KB messages expired together made one 3 MB batch,
    refused by a 1 MiB dead-letter topic, retried for ever (the partition stuck)."""
    letters: list[qd.Letter | None] = [_letter(i, os.urandom(100_000)) for i in range(30)]
    frames, dropped = _write_all(letters, MIB)
    assert dropped == []
    assert len(frames) >= 3 and all(len(f) <= MIB for f in frames)
    for frame in frames:
        batch_format.validate(frame, MIB)  # what the dead-letter topic's leader checks
    values = [v for f in frames for v in batch_format.decode_batch(f).values]
    assert values == [x[2] for x in letters if x is not None]  # all of them, in order


def test_the_limit_is_the_topics_as_it_is_and_the_bytes_per_write_bound_stays() -> None:
    letters: list[qd.Letter | None] = [_letter(i, os.urandom(1_500)) for i in range(40)]
    frames, _dropped = _write_all(letters, 16 * 1024)  # a dead-letter topic altered to 16 KiB
    assert len(frames) > 3 and all(len(f) <= 16 * 1024 for f in frames)
    big = [_letter(i, os.urandom(3 * MIB // 2)) for i in range(3)]
    taken, written, unfit = qd.next_dead_letter_write(list(big), 64 * MIB)
    assert (taken, written, unfit) == (2, [0, 1], [])  # DEAD_LETTER_BYTES_PER_WRITE (4 MiB) reached


def test_a_dead_letter_that_can_never_fit_is_dropped_and_the_rest_are_written() -> None:
    letters: list[qd.Letter | None] = [_letter(0, b"small"), _letter(1, os.urandom(70_000)), None,
                                       _letter(3, b"also small")]
    frames, dropped = _write_all(letters, 64 * 1024)
    assert dropped == [1]
    assert [v for f in frames for v in batch_format.decode_batch(f).values] == [b"small", b"also small"]


def test_a_value_that_fits_only_compressed_goes_alone() -> None:
    compressible = _letter(0, b"a" * (3 * MIB))  # a producer sent it lz4 into a 1 MiB queue
    assert qd.letter_fits(compressible, MIB)
    letters: list[qd.Letter | None] = [_letter(1, b"x"), compressible, _letter(2, b"y")]
    frames, dropped = _write_all(letters, MIB)
    assert dropped == [] and [len(batch_format.decode_batch(f).values) for f in frames] == [1, 1, 1]
    assert all(len(f) <= MIB for f in frames)


def test_a_message_at_the_queues_limit_fits_the_room_create_queue_gives_its_dead_letter_topic() -> None:
    """A message of the queue's whole message_bytes_max, with the longest queue name and
    reason the node writes: its dead letter fits message_bytes_max + DEAD_LETTER_ROOM_BYTES,
    and not the queue's own limit (the headers push it over)."""
    limit_bytes = 64 * 1024
    value = os.urandom(limit_bytes - BATCH_HEADER_BYTES - batch_format.RECORD_FIXED_BYTES)
    assert len(batch_format.encode_batch([0], [None], [value], adaptive=True)) == limit_bytes  # the queue took it
    record = (0, None, value, [(qp.HEADER_TTL_MS, b"100")])
    letter = qd.dead_letter("q" * 200, 99_999, qs.Finished(2**62, qs.DEAD, qp.MAX_DELIVERIES_MAX, "r" * 70_000),
                            record)
    assert not qd.letter_fits(letter, limit_bytes)
    assert qd.letter_fits(letter, limit_bytes + qp.DEAD_LETTER_ROOM_BYTES)
    assert dict(letter[3])[qp.HEADER_DLQ_REASON] == b"r" * qp.DEAD_LETTER_REASON_BYTES_MAX  # cut
    assert qp.HEADER_TTL_MS not in dict(letter[3])


def test_a_cut_reason_stays_utf8() -> None:
    letter = qd.dead_letter("q", 0, _finished(0, "é" * 5_000), (0, None, b"v", []))
    reason = dict(letter[3])[qp.HEADER_DLQ_REASON]
    assert reason is not None and len(reason) <= qp.DEAD_LETTER_REASON_BYTES_MAX
    reason.decode("utf-8")


def test_a_dead_letter_dropped_instead_is_counted_dropped_and_written_so() -> None:
    s = qs.ShareState(qs.QueueConfig(max_deliveries=1, dead_letter="jobs.dlq"))
    for _ in range(2):
        s.append(s.next_offset, 0)
    s.drain_changes()
    s.acquire("w", 2, 0)
    s.drain_changes()
    finished = [f for f in (s.nack("w", 0, 1), s.nack("w", 1, 1)) if f is not None]
    assert [f.state for f in finished] == [qs.DEAD, qs.DEAD]
    s.drop_dead_letter(1)
    assert (s.counts()["dead_lettered"], s.counts()["dropped"]) == (1, 1)
    changes = qd.as_dropped(s.drain_changes(), {1})
    assert [(c.offset, c.state) for c in changes] == [(0, qs.DEAD), (1, qs.DROPPED)]


def test_unfit_letters_names_only_those_no_batch_can_hold() -> None:
    dead = [_finished(0), _finished(1), _finished(2)]
    found = {0: (0, None, b"small", []), 1: (0, None, os.urandom(70_000), [])}  # 2: removed by retention
    assert qd.unfit_letters("jobs", 0, dead, found, "jobs.dlq", 64 * 1024) == [dead[1]]
    assert qd.unfit_letters("jobs", 0, dead, found, "jobs.dlq", 64 * 1024 + qp.DEAD_LETTER_ROOM_BYTES) == []


@pytest.mark.parametrize("internal", ["__queue_state", "__consumer_offsets", "__anything"])
def test_an_internal_topic_is_refused_as_dead_letter(internal: str) -> None:
    with pytest.raises(errors.InvalidQueueConfigError, match="internal"):
        zkl.TopicConfig.build(1, 1, {"queue": "true", "dead_letter": internal}, 0)
    with pytest.raises(errors.InvalidQueueConfigError, match="internal"):
        zkl.TopicConfig.build(1, 1, {"dead_letter": internal}, 0)  # any topic may be read as a queue


def test_a_config_naming_an_internal_topic_already_drops_instead_of_writing_there() -> None:
    """A topic made before the refusal: the node never writes its dead letters there."""
    config = zkl.TopicConfig(partitions=1, queue=True, dead_letter="__queue_state")
    assert queue_config(config, "old").dead_letter == ""
    assert queue_config(zkl.TopicConfig(partitions=1, dead_letter="jobs.dlq")).dead_letter == "jobs.dlq"


def test_a_dedup_id_is_measured_as_sent_and_must_be_utf8() -> None:
    now_ms = 1_700_000_000_000
    qp.check_sent_headers([(qp.HEADER_DEDUP_ID, "é".encode() * 64)], now_ms)  # 128 bytes
    qp.check_sent_headers([(qp.HEADER_DEDUP_ID, None)], now_ms)  # null: none
    for raw in (b"\xff" * 10, b"order-\xc3", b"\xed\xa0\x80"):  # not UTF-8, however short
        with pytest.raises(errors.InvalidRequestError, match="UTF-8"):
            qp.check_sent_headers([(qp.HEADER_DEDUP_ID, raw)], now_ms)
    with pytest.raises(errors.InvalidRequestError, match="DEDUP_ID_BYTES_MAX"):
        qp.check_sent_headers([(qp.HEADER_DEDUP_ID, b"x" * 129)], now_ms)
    with pytest.raises(errors.InvalidRequestError, match="UTF-8"):  # every copy, not only the last
        qp.check_sent_headers([(qp.HEADER_DEDUP_ID, b"\xff"), (qp.HEADER_DEDUP_ID, b"ok")], now_ms)


def test_a_retried_state_write_does_not_write_its_dead_letters_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead letter is written (acks=all) before the ``__queue_state`` record saying it left
    the queue. When that record's write failed (its leader failing over) the retry wrote the
    dead letters again too: a duplicate in the dead-letter queue per retry, with no crash
    (a fault hunt found one message six times). Only the state records are written again."""
    durable = object.__new__(QueueDurability)  # no node, no socket: the writes are stubbed
    route = SimpleNamespace(config=SimpleNamespace(partitions=50))
    monkeypatch.setattr(durable, "node", SimpleNamespace(routing=SimpleNamespace(topic=lambda _name: route)),
                        raising=False)
    slot = Slot(SharePartition("jobs", 0, 1, zkl.TopicConfig.build(1, 1, {"queue": "true"}, 0)))
    monkeypatch.setattr(durable, "_slots", {("jobs", 0): slot}, raising=False)
    letters: list[list[Any]] = []
    codes = [errors.RequestTimedOutError.code, 0]  # the state write times out once, then succeeds

    def dead_letter(_slot: Slot, dead: list[Any], done: Any) -> None:
        letters.append(list(dead))
        done(0, "")

    monkeypatch.setattr(durable, "_dead_letter", dead_letter)
    monkeypatch.setattr(durable, "_produce", lambda _topic, _partition, _records, done: done(codes.pop(0), "timed out"))
    slot.pending.append((b"key", b"value"))
    slot.queued += 1
    slot.dead.append(("workers", qs.Finished(7, qs.DEAD, 3, "poison")))
    durable._flush(slot)
    assert slot.retry_until_s and slot.pending  # the state record waits for its retry
    slot.next_flush_s = 0.0  # which is due
    durable._flush(slot)
    assert len(letters) == 1 and slot.written == 1 and not slot.pending and not slot.dead

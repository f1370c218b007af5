"""The ordering rule of strict-order topics (sdk/ordered.py), fed by hand: no sockets."""

from __future__ import annotations

import random

import pytest

from fabric import errors
from sdk.ordered import OrderedMerge


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_logs(seed: int, partitions: int, ids: int, tick_every: int) -> dict[int, list[tuple[int, int, bool]]]:
    """Each partition's log as (global_id, offset, is_tick): IDs 1..ids spread at random,
    increasing along every log, with ticks where a partition was idle."""
    rng = random.Random(seed)
    logs: dict[int, list[tuple[int, int, bool]]] = {p: [] for p in range(partitions)}
    for gid in range(1, ids + 1):
        p = rng.randrange(partitions)
        tick = gid % tick_every == 0
        logs[p].append((gid, len(logs[p]), tick))
    return logs


def read_all(logs: dict[int, list[tuple[int, int, bool]]], seed: int, chunk_max: int = 7) -> tuple[list[int], int]:
    """Feed the logs in a random interleaving of fetch-sized chunks; pop as we go."""
    rng = random.Random(seed)
    merge: OrderedMerge[int] = OrderedMerge(logs, clock=Clock())
    cursors = dict.fromkeys(logs, 0)
    delivered: list[int] = []
    while any(cursors[p] < len(logs[p]) for p in logs):
        p = rng.choice([p for p in logs if cursors[p] < len(logs[p])])
        for gid, offset, tick in logs[p][cursors[p]: cursors[p] + rng.randint(1, chunk_max)]:
            if tick:
                merge.advance(p, gid)
            else:
                merge.push(p, gid, offset, gid)
            cursors[p] += 1
        delivered.extend(item for _gid, item in merge.pop_ready(rng.randint(1, 50)))
    delivered.extend(item for _gid, item in merge.pop_ready(10**9))
    return delivered, merge.watermark


@pytest.mark.parametrize("seed", range(5))
def test_every_interleaving_delivers_the_same_increasing_sequence(seed: int) -> None:
    logs = make_logs(seed, partitions=6, ids=3_000, tick_every=5)
    first, watermark = read_all(logs, seed=1000 + seed)
    second, _ = read_all(logs, seed=2000 + seed, chunk_max=50)
    assert first == second
    assert first == sorted(first) and len(first) == len(set(first))
    records = sorted(gid for log in logs.values() for gid, _o, tick in log if not tick)
    assert first == [gid for gid in records if gid <= watermark]


def test_an_idle_partition_holds_the_watermark_until_it_ticks() -> None:
    clock = Clock()
    merge: OrderedMerge[str] = OrderedMerge([0, 1], clock=clock)
    merge.push(0, 5, 0, "a")
    merge.push(0, 9, 1, "b")
    assert merge.pop_ready(10) == []  # partition 1 has said nothing: 2, 3, 4 may still come
    clock.now += 2.0
    assert merge.pop_ready(10) == []
    assert merge.stalled_s() == pytest.approx(2.0)
    merge.push(1, 7, 0, "c")
    assert merge.pop_ready(10) == [(5, "a"), (7, "c")]
    merge.advance(1, 12)  # a tick: partition 1 will never add anything at or below 12
    assert merge.pop_ready(10) == [(9, "b")]
    assert merge.longest_stall_s == pytest.approx(2.0)
    assert merge.stalled_s() == 0.0


def test_an_id_in_two_partitions_is_refused_not_hidden() -> None:
    merge: OrderedMerge[str] = OrderedMerge([0, 1], clock=Clock())
    merge.push(0, 4, 0, "a")
    merge.push(1, 4, 0, "b")
    with pytest.raises(errors.InvalidGlobalIdError):
        merge.pop_ready(10)


def test_a_re_read_record_is_ignored() -> None:
    merge: OrderedMerge[str] = OrderedMerge([0], clock=Clock())
    merge.push(0, 4, 0, "a")
    merge.push(0, 4, 0, "a")
    assert merge.pop_ready(10) == [(4, "a")] and merge.ignored_count == 1


def test_shedding_bounds_memory_and_changes_nothing_in_the_sequence() -> None:
    logs = make_logs(7, partitions=3, ids=400, tick_every=1_000_000)
    logs[2] = [(gid, off, tick) for gid, off, tick in logs[2]]
    merge: OrderedMerge[int] = OrderedMerge(logs, clock=Clock(), pending_records_max=20)
    # Partitions 0 and 1 fetched completely, partition 2 not at all: everything waits.
    for p in (0, 1):
        for gid, offset, _tick in logs[p]:
            merge.push(p, gid, offset, gid)
    assert merge.over_limit()
    seek_to = merge.shed()
    assert set(seek_to) == {0, 1} and merge.pending_count == 0
    assert all(seek_to[p] == 0 for p in seek_to)
    delivered: list[int] = []
    cursors = dict.fromkeys(logs, 0)
    cursors.update(seek_to)
    while any(cursors[p] < len(logs[p]) for p in logs):
        for p in logs:
            for gid, offset, _tick in logs[p][cursors[p]: cursors[p] + 5]:
                merge.push(p, gid, offset, gid)
                cursors[p] += 1
        delivered.extend(item for _g, item in merge.pop_ready(1_000))
    delivered.extend(item for _g, item in merge.pop_ready(1_000))
    expected = sorted(gid for log in logs.values() for gid, _o, _t in log)
    assert delivered == [gid for gid in expected if gid <= merge.watermark]

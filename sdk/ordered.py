"""Ordered consumption of strict-order topics: one total order by global ID.

Every record of a strict-order topic carries a global ID stamped by its partition's
leader from a sequencer grant (docs/DESIGN.md, "Strict-order topics"). IDs increase
along every partition's log. So once a reader has fetched, from partition ``p``, a
record (or a tick, the leader's one-record control batch for idle partitions) with ID
``last[p]``, every record ``p`` will ever add has a higher ID. The watermark

    W = min over the topic's partitions of last[p]

is therefore final: every record with ID <= W has been fetched, and delivering them in
ID order never has to be undone. Every reader applies the same rule to the same logs,
so every ordered reader of a topic sees the same sequence. ``OrderedMerge`` is that rule,
pure (no sockets, an injected clock); ``OrderedConsumer`` feeds it from a ``Consumer``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from fabric import errors
from fabric.protocol import batch as batch_format
from sdk._client import PARTITION_LEARN_WAIT_MS, TopicPartition
from sdk.consumer import Consumer, Record

# Records held back until the watermark passes them. Past this, the partitions that run
# ahead are shed (dropped here and fetched again later), so memory stays bounded even
# while one partition stalls.
PENDING_RECORDS_MAX_DEFAULT = 500_000
# Records that waited this long for the watermark make the reader ask again where the
# partitions are led, at most once per this interval. Its consumer asks only when a fetch
# goes unanswered, and a leader cut off from ZooKeeper (alone) answers every fetch, with
# nothing new, until it is healed: the whole order stalled that long (a fault hunt: 7 to
# 9.5 s against the 6 s bound, each time until the heal), while a new leader took writes.
STALL_RECHECK_S = 1.0
NO_ID = 0  # IDs start at 1 (fabric.protocol.sequencer.FIRST_GLOBAL_ID)
# Consumer options that make no sense for an ordered reader (see OrderedConsumer.__init__).
REFUSED_CONSUMER_OPTIONS = ("group_id", "group_instance_id", "tag_filter")

T = TypeVar("T")


class OrderedMerge(Generic[T]):
    """The merge rule of the module docstring, over items of type ``T`` tagged with
    (partition, global ID, offset). Pure: the caller pushes what it fetched and pops what
    is final."""

    def __init__(self, partitions: Iterable[int], *, clock: Callable[[], float] = time.monotonic,
                 pending_records_max: int = PENDING_RECORDS_MAX_DEFAULT) -> None:
        self.clock = clock
        self.pending_records_max = pending_records_max
        self.last_id: dict[int, int] = dict.fromkeys(partitions, NO_ID)
        if not self.last_id:
            raise ValueError("an ordered merge needs at least one partition")
        self.pending: dict[int, deque[tuple[int, int, T]]] = {p: deque() for p in self.last_id}
        self.pending_count = 0
        self.delivered_id = NO_ID
        self.delivered_count = 0
        self.ignored_count = 0  # items at or below their partition's last ID (a re-read)
        self._watermark = NO_ID
        self._watermark_moved_at = clock()
        self.longest_stall_s = 0.0

    # -- input -----------------------------------------------------------------------------
    def push(self, partition: int, global_id: int, offset: int, item: T) -> None:
        """A fetched record, in its partition's log order."""
        if global_id <= self.last_id[partition]:
            self.ignored_count += 1
            return
        self.last_id[partition] = global_id
        self.pending[partition].append((global_id, offset, item))
        self.pending_count += 1

    def advance(self, partition: int, global_id: int) -> None:
        """A tick (or any control batch): no record, but nothing below ``global_id`` will follow."""
        if global_id > self.last_id[partition]:
            self.last_id[partition] = global_id

    # -- output ----------------------------------------------------------------------------
    @property
    def watermark(self) -> int:
        return min(self.last_id.values())

    def pop_ready(self, max_items: int) -> list[tuple[int, T]]:
        """Up to ``max_items`` (global ID, item) pairs with ID <= watermark, in ID order."""
        watermark = self.watermark
        now = self.clock()
        if watermark != self._watermark:
            self._watermark = watermark
            self._watermark_moved_at = now
        elif self.pending_count:
            self.longest_stall_s = max(self.longest_stall_s, now - self._watermark_moved_at)
        heads = [(q[0][0], p) for p, q in self.pending.items() if q and q[0][0] <= watermark]
        heapq.heapify(heads)
        out: list[tuple[int, T]] = []
        while heads and len(out) < max_items:
            global_id, partition = heapq.heappop(heads)
            queue = self.pending[partition]
            _gid, _offset, item = queue.popleft()
            if global_id <= self.delivered_id:
                # Two partitions holding one ID means a sequencer issued it twice: refuse to
                # hide that, whatever it costs the reader.
                raise errors.InvalidGlobalIdError(
                    f"global ID {global_id} in partition {partition} is not above the last delivered "
                    f"{self.delivered_id}")
            self.delivered_id = global_id
            out.append((global_id, item))
            if queue and queue[0][0] <= watermark:
                heapq.heappush(heads, (queue[0][0], partition))
        self.pending_count -= len(out)
        self.delivered_count += len(out)
        return out

    def stalled_s(self) -> float:
        """How long records have waited for the watermark to move (0 when nothing waits)."""
        if not self.pending_count or self.watermark != self._watermark:
            return 0.0
        return self.clock() - self._watermark_moved_at

    # -- bounding memory -------------------------------------------------------------------
    def over_limit(self) -> bool:
        return self.pending_count > self.pending_records_max

    def shed(self) -> dict[int, int]:
        """Drop the held records of every partition that is ahead of the watermark and
        return {partition: offset to fetch again from}. Its ``last_id`` falls back to just
        below its first dropped record, which is still a true bound (the re-fetch brings
        that record again)."""
        watermark = self.watermark
        seek_to: dict[int, int] = {}
        for partition, queue in self.pending.items():
            if not queue or self.last_id[partition] <= watermark:
                continue
            ahead = [entry for entry in queue if entry[0] > watermark]
            if not ahead:
                continue
            first_id, first_offset, _item = ahead[0]
            for _ in range(len(ahead)):
                queue.pop()
            self.pending_count -= len(ahead)
            self.last_id[partition] = first_id - 1
            seek_to[partition] = first_offset
        return seek_to


class OrderedConsumer:
    """Reads every partition of one strict-order topic and yields its records in global-ID
    order (``record.global_id``). Every OrderedConsumer of the topic that starts from the
    beginning sees the identical sequence; one that starts at the end
    (``from_beginning=False``) sees its suffix: every record with an ID above the largest
    in the topic when it started, no hole. It reads every partition itself: it takes no
    ``group_id`` and no ``tag_filter``, and commits nothing (a restarted reader starts over).

    ``poll`` returns what is final; records of a partition whose leader died wait until a
    new leader ticks (the bound is in docs/DESIGN.md, "Strict-order topics").

    It has no ``pause()``, and its ``consumer.pause()`` raises InvalidRequestError: one
    paused partition would hold the watermark at its last ID, so nothing of any partition
    would be final until it is resumed, while the others' records pile up to
    ``pending_records_max`` and are shed and fetched again, over and over. To stop reading
    for a while, stop calling ``poll()``: there is no group to keep a membership in.

    ``bootstrap`` comes before ``topic``, as for every client; None (``OrderedConsumer(None,
    "ledger")``): ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded.
    """

    def __init__(self, bootstrap: str | None, topic: str, *, from_beginning: bool = True,
                 pending_records_max: int = PENDING_RECORDS_MAX_DEFAULT,
                 clock: Callable[[], float] = time.monotonic, **consumer_options: Any) -> None:
        # A group would hand this reader some partitions, and the merge needs all of them;
        # its commits would be fetch positions, past records still held for the watermark.
        # A tag filter works per record in Consumer.poll, which this reader does not use.
        # Each was taken and then ignored or refused at the first poll: say so here instead.
        refused = sorted(name for name in REFUSED_CONSUMER_OPTIONS if consumer_options.get(name) is not None)
        if refused:
            raise ValueError(f"an OrderedConsumer reads every partition itself and takes no {', '.join(refused)} "
                             "(no consumer group, no tag filter; filter the records it returns)")
        self.topic = topic
        # "earliest" also when starting at the end: that start is set by seeks below, and a
        # reset to the latest offset would skip records appended meanwhile, above the cut.
        self.consumer = Consumer(bootstrap, auto_offset_reset="earliest", **consumer_options)
        self.consumer.skip_control_batches = False  # ticks move the watermark
        self.consumer._pause_refused = (
            f"an OrderedConsumer of {topic!r} reads every partition for one order: a paused partition would stop "
            "them all; to stop reading for a while, stop calling poll()")
        try:
            # A topic just created (LEADER_NOT_AVAILABLE until the node asked has learned
            # it) is asked about again, as assign() does.
            meta = self.consumer._topic_within(topic, time.monotonic() + PARTITION_LEARN_WAIT_MS / 1000.0)
            if not meta.strict_order:
                raise errors.InvalidRequestError(
                    f"topic {topic!r} is not strict-order; create it with strict_order=True to read it in order")
            self.partitions = self.consumer.subscribe_all_partitions(topic)
        except BaseException:
            self.consumer.close()
            raise
        self.merge: OrderedMerge[Record] = OrderedMerge(
            [tp.partition for tp in self.partitions], clock=clock, pending_records_max=pending_records_max)
        # A reader that starts at the end delivers exactly the records with an ID above
        # ``cut_id``: the largest ID among the partitions' last records when it started.
        # Starting each partition at its own end offset is not enough: a record committed
        # in one partition between two end-offset lookups, with an ID below records taken
        # from another, was skipped while those were delivered, a hole in the middle of
        # what the reader handed out (found by an audit: 20-40 records missing per reader
        # under 3 producers). Every record before a partition's end has an ID at or below
        # that partition's last, so none of them is above ``cut_id``; every one after it is
        # fetched and delivered when above ``cut_id``.
        self.cut_id = NO_ID
        self._cut_offsets: dict[int, int] = {}  # partition -> offset of the last record, its ID still to learn
        self._rechecked_at = float("-inf")  # the merge's clock: the last stalled re-read of the map
        if not from_beginning:
            try:
                for tp, end in self.consumer.end_offsets(self.partitions).items():
                    if end > 0:
                        self._cut_offsets[tp.partition] = end - 1
                        self.consumer.seek(tp, end - 1)
            except BaseException:
                self.consumer.close()
                raise

    @property
    def watermark(self) -> int:
        return self.merge.watermark

    def poll(self, timeout_ms: int = 1000, max_records: int = 10_000) -> list[Record]:
        """Up to ``max_records`` final records in global-ID order, waiting at most ``timeout_ms``."""
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        while True:
            # Nothing is final before the cut is known: a record below it is not this reader's.
            ready = [] if self._cut_offsets else self.merge.pop_ready(max_records)
            records = [record for global_id, record in ready if global_id > self.cut_id]
            if records:
                return records
            if ready:
                continue  # all below the cut: look again before waiting
            remaining_ms = math.ceil((deadline - time.monotonic()) * 1000)  # up: never a 0 ms spin
            if remaining_ms <= 0:
                return []
            if self.merge.over_limit():
                for partition, offset in self.merge.shed().items():
                    self.consumer.seek(TopicPartition(self.topic, partition), offset)
            self._recheck_leaders_if_stalled(remaining_ms)
            for raw in self.consumer.poll_raw_batches(timeout_ms=min(remaining_ms, 100)):
                self._feed(raw.partition, raw.buf, raw.skip)

    def _recheck_leaders_if_stalled(self, remaining_ms: int) -> None:
        """Records wait for a partition that brings nothing new: its leader may have been
        replaced while the old one, cut off from ZooKeeper, still answers fetches. Re-read
        the map (a node past its ZooKeeper lease refuses METADATA, so the answer comes from
        one that knows), within this poll's time. Best effort: when no node answers (all of
        ZooKeeper away) the cached map stays and fetching goes on as before."""
        now = self.merge.clock()
        if self.merge.stalled_s() < STALL_RECHECK_S or now - self._rechecked_at < STALL_RECHECK_S:
            return
        self._rechecked_at = now
        try:
            with self.consumer._within(min(remaining_ms, 1000) / 1000.0):
                self.consumer._refresh([self.topic])
        except errors.FabricError:
            pass

    def _feed(self, partition: int, buf: Any, skip: int) -> None:
        header = batch_format.read_header(buf)
        if header.global_id_base < 0:
            raise errors.InvalidGlobalIdError(
                f"{self.topic}/{partition}@{header.base_offset}: a batch without global IDs in a strict-order topic")
        cut_offset = self._cut_offsets.pop(partition, None)
        if cut_offset is not None and header.base_offset <= cut_offset < header.next_offset:
            self.cut_id = max(self.cut_id, header.global_id_base + cut_offset - header.base_offset)
        # A first batch past cut_offset: that record is gone (retention), and with it every
        # record of this partition the cut had to pass over.
        if header.attributes & batch_format.ATTRIBUTE_CONTROL:
            self.merge.advance(partition, header.global_id_base + header.record_count - 1)
            return
        decoded = batch_format.decode_batch(buf, check_crc=self.consumer.check_crc)
        base_id, base_offset, topic = header.global_id_base, header.base_offset, self.topic
        for i in range(skip, header.record_count):
            self.merge.push(partition, base_id + i, base_offset + i, Record(
                topic, partition, base_offset + i, decoded.timestamps[i], decoded.keys[i], decoded.values[i],
                decoded.headers[i], base_id + i))

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> OrderedConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The consumer: assign partitions, seek, and poll records or whole decoded batches.

One FETCH per leader node is kept in flight while the caller works through what came
back (prefetch), so a consumer that keeps up is never waiting a round trip. A fetch at
the log end long-polls on the node (``fetch_max_wait_ms``), so new data arrives pushed,
not by polling in a loop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

import zmq

from fabric import allocator, errors
from fabric.auth.curve import ClientSecurity
from fabric.limits import FETCH_WAIT_MS_MAX
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol import groups as gp
from fabric.protocol.apis import ApiKey
from fabric.protocol.tags import TagFilter, record_tags
from fabric.transport import FROM_ENV
from sdk._arguments import I32_MAX, I64_MAX, int_arg, names_arg, optional_str_arg, str_arg
from sdk._client import (
    LEADER_RECHECK_INTERVAL_S,
    METADATA_CONNECT_MS,
    METADATA_TIMEOUT_MS,
    PARTITION_LEARN_PAUSE_S,
    PARTITION_LEARN_WAIT_MS,
    Bootstrap,
    Connections,
    DroppedNodes,
    MetadataClient,
    TopicMetadata,
    TopicPartition,
)
from sdk._group import ConsumerRebalanceListener, GroupMember, OffsetAndMetadata

log = logging.getLogger("fabric.consumer")

# What commit() takes: partition -> next offset to read, alone or with its metadata string.
CommitOffsets = Mapping[TopicPartition, int | tuple[int, str] | OffsetAndMetadata]

BUFFERED_BATCHES_MAX = 256  # decoded batches held for the caller before fetching pauses
FETCH_GRACE_MS = 1_000  # a fetch this late past its max_wait makes us check for a new leader
# What a poll does besides waiting for records (auto commit, a heartbeat, re-reading the
# routing map, looking up where new partitions start) ends within this past the poll's
# timeout_ms (or a group's heartbeat timeout, if longer). Unbounded, a poll(timeout_ms=1000)
# with every node paused took 30 s (the auto commit's whole request_timeout_ms, each try
# asking every node for the coordinator and then re-reading the map) and 12 s in a map
# re-read; the same bound as a queue receive's map re-reads (MAP_REFRESH_TIMEOUT_MS).
POLL_WORK_MS = METADATA_TIMEOUT_MS
# While no node answers, each poll's map re-read fails: the warning says so once, then at
# most this often with how many failed since (every poll of a down cluster logged one).
REFRESH_WARNING_INTERVAL_S = 10.0


class Record:
    __slots__ = ("global_id", "headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, topic: str, partition: int, offset: int, timestamp: int, key: bytes | None,
                 value: bytes | None, headers: list[tuple[str, bytes | None]], global_id: int = -1) -> None:
        self.global_id = global_id  # strict-order topics: the record's global ID; else -1
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def __repr__(self) -> str:
        return f"Record({self.topic}/{self.partition}@{self.offset} key={self.key!r} value={self.value!r:.60})"


@dataclass
class RecordBatch:
    """Records of one batch from ``start`` on, as columns (the fast path).

    ``timestamp_type``: the batch's timestamp-type bit as its producer declared it: 0 = create
    time (the Fabric producers always), 1 = log-append time; nodes never rewrite timestamps.
    """

    topic: str
    partition: int
    base_offset: int
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[tuple[str, bytes | None]]]
    timestamp_type: int = 0
    global_id_base: int = -1  # strict-order topics: the global ID of values[0]; else -1

    def __len__(self) -> int:
        return len(self.values)

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.values)

    def records(self) -> Iterator[Record]:
        t, p, base, gid = self.topic, self.partition, self.base_offset, self.global_id_base
        for i, (ts, k, v, h) in enumerate(zip(self.timestamps, self.keys, self.values, self.headers, strict=False)):
            yield Record(t, p, base + i, ts, k, v, h, gid + i if gid >= 0 else -1)


class RawBatch:
    """A fetched batch not decoded yet: decoding waits until the caller takes it, so the
    next fetch is already travelling while we decode (the node and we work in parallel).

    ``poll_raw_batches`` hands these out as they are: ``buf`` is the batch exactly as the
    producer made it (stamped by the leader); records below ``base_offset + skip`` were
    already consumed. ``fabric.protocol.batch.column_view(buf)`` gives its columns."""

    __slots__ = ("buf", "partition", "skip", "topic")

    def __init__(self, topic: str, partition: int, buf: Any, skip: int) -> None:
        self.topic = topic
        self.partition = partition
        self.buf = buf
        self.skip = skip


def _position_marker(tp: TopicPartition, next_offset: int) -> RecordBatch:
    """An empty batch whose only use is to move the caller's position to ``next_offset``
    once it gets there: past batches the node left out for a tag filter, or past ticks."""
    return RecordBatch(tp.topic, tp.partition, next_offset, [], [], [], [])


def _as_tp(item: TopicPartition | tuple[str, int]) -> TopicPartition:
    """A TopicPartition from either form, its fields checked: a wrong type would otherwise
    fail deep in the encoder, and a partition outside i32 as a struct.error."""
    if isinstance(item, TopicPartition):
        topic, partition = item.topic, item.partition
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        topic, partition = item
    else:
        raise TypeError(f"expected a TopicPartition or a (topic, partition) tuple, got {type(item).__name__} {item!r:.60}")
    str_arg("topic", topic)
    number = int_arg("partition", partition, -I32_MAX - 1, I32_MAX)
    if number < 0:  # the answer assign() has always given for a partition the topic lacks
        raise errors.UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {number}")
    return item if isinstance(item, TopicPartition) else TopicPartition(topic, number)


def _tp_list(name: str, partitions: object) -> list[TopicPartition]:
    if isinstance(partitions, (str, bytes, TopicPartition)) or not isinstance(partitions, Iterable):
        raise TypeError(f"{name} must be a list of TopicPartition or (topic, partition), got "
                        f"{type(partitions).__name__} {partitions!r:.60}")
    return [_as_tp(p) for p in partitions]


def _one_or_many(name: str, partitions: object) -> list[TopicPartition]:
    """One partition (a TopicPartition or a (topic, partition) tuple) or an iterable of
    them: pause() and resume() take both, as Kafka's take a collection and kafka-python's
    single partitions."""
    if isinstance(partitions, TopicPartition) or (
            isinstance(partitions, tuple) and len(partitions) == 2 and isinstance(partitions[0], str)):
        return [_as_tp(partitions)]
    return _tp_list(name, partitions)


def _poll_args(timeout_ms: float, max_records: int) -> None:
    # A negative timeout means "do not wait", as it always has; a float is a wait too
    # (``poll(timeout_ms=0.5 * 1000)``); a str or nan is a bug.
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float) or math.isnan(timeout_ms):
        raise TypeError(f"timeout_ms must be a number of milliseconds, got {type(timeout_ms).__name__} {timeout_ms!r:.60}")
    int_arg("max_records", max_records, 1, I64_MAX)


def _commit_offsets(offsets: object) -> dict[TopicPartition, tuple[int, str]]:
    """``commit()``'s argument checked whole before anything is sent: partition -> next
    offset (0 up to i64), or -> (offset, metadata str), or -> OffsetAndMetadata (what
    ``committed(tp, metadata=True)`` returns; its leader_epoch is not sent: the wire has none)."""
    if not isinstance(offsets, Mapping):
        raise TypeError(f"offsets must be a dict of partition to offset, got {type(offsets).__name__}")
    wanted: dict[TopicPartition, tuple[int, str]] = {}
    for tp, value in offsets.items():
        if isinstance(value, OffsetAndMetadata):
            offset, metadata = value.offset, value.metadata
        else:
            offset, metadata = value if isinstance(value, tuple) and len(value) == 2 else (value, "")
        text = str_arg("commit metadata", metadata)
        if len(text.encode()) > gp.OFFSET_METADATA_BYTES_MAX:
            raise ValueError(f"commit metadata for {tp} is {len(text.encode())} bytes in UTF-8, more than "
                             f"OFFSET_METADATA_BYTES_MAX={gp.OFFSET_METADATA_BYTES_MAX} (Kafka's offset.metadata.max.bytes)")
        wanted[_as_tp(tp)] = (int_arg("offset", offset, 0, I64_MAX), text)
    return wanted


class HandOut:
    """One poll's records handed to an iterating caller one at a time (``Consumer.__iter__``,
    ``AsyncConsumer``): a partition's position stays at the record being handled and moves
    past it only when the caller asks for the next one, so a commit made while the caller is
    in its loop, or after it left the loop, covers only the records it finished. A partition
    whose position someone else moves meanwhile (``seek()``, a revocation) gets no more of
    these records."""

    def __init__(self, consumer: Consumer, records: list[Record]) -> None:
        self.records = records
        self._consumer = consumer
        self._positions = consumer._positions
        # Partitions paused while this was handed out: none of their records follows (a
        # later one would skip the first refused), and their positions stay at the first
        # refused record, from which the next poll reads them again (as kafka-python's
        # iterator stops a partition that is no longer fetchable).
        self._stopped: set[TopicPartition] = set()
        consumer._iteration = self  # the consumer's next poll reads what this left unfinished again
        self._ends: dict[TopicPartition, int] = {}  # where poll() left each position: past all it read
        self._held: dict[TopicPartition, int] = {}  # each position as this hand-out last set it
        for record in records:
            tp = TopicPartition(record.topic, record.partition)
            if tp not in self._held and tp in self._positions:
                self._ends[tp] = self._positions[tp]
                self._held[tp] = self._positions[tp] = record.offset

    def take(self, record: Record) -> bool:
        """Whether to hand ``record`` out (its partition's position is still ours); if so
        the position is now at it."""
        tp = TopicPartition(record.topic, record.partition)
        if self._held.get(tp, -1) != self._positions.get(tp):
            return False
        if self._stopped and tp in self._stopped:
            return False
        paused = self._consumer._paused
        if paused and tp in paused:
            self._stopped.add(tp)
            return False
        self._held[tp] = self._positions[tp] = record.offset
        return True

    def done(self, record: Record) -> None:
        tp = TopicPartition(record.topic, record.partition)
        if self._held[tp] == self._positions.get(tp):
            self._held[tp] = self._positions[tp] = record.offset + 1

    def finish(self) -> None:
        """Every record handed out: positions go where poll() had put them."""
        for tp, end in self._ends.items():
            if self._held[tp] == self._positions.get(tp) and tp not in self._stopped:
                self._positions[tp] = self._held[tp] = end
        # A partition paused meanwhile stays unfinished: the next poll reads it again from
        # the first record it refused (``unfinished``), once it is resumed.
        self._ends = {tp: end for tp, end in self._ends.items() if tp in self._stopped}

    def unfinished(self) -> dict[TopicPartition, int]:
        """After leaving early: the partitions to read again, from where the caller stopped."""
        return {tp: self._held[tp] for tp, end in self._ends.items()
                if self._held[tp] == self._positions.get(tp) and self._held[tp] != end}


class Consumer:
    """Read assigned partitions from their leaders.

    ``bootstrap``: ``zk://HOST:PORT[/chroot]`` (ZooKeeper) or ``tcp://HOST:PORT,...`` (nodes);
    None: ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded (ConfigError if neither,
    fabric/bootstrap.py). An empty string is a ValueError, never "find one".

    ``auto_offset_reset``: where to start a partition with no position, or whose position
    fell out of the log (retention): ``earliest``, ``latest`` or ``none`` (raise
    OffsetOutOfRangeError).

    With ``group_id`` the consumer can ``subscribe()`` and share partitions with the other
    members of the group (docs/GROUPS.md); committed offsets are kept by the cluster. With
    ``enable_auto_commit`` the positions of records already handed out by ``poll()`` are
    committed every ``auto_commit_interval_ms``, before partitions are revoked, and on
    ``close()``. ``assign()`` keeps working without a group, or with one for commits only.

    One thread at a time: like Kafka's consumer (and its ZeroMQ sockets) it is not
    thread-safe, so call ``close()`` from the thread that polls or iterates (to stop a loop
    from another thread, set a flag the loop checks, and poll with a timeout). The asyncio
    consumer (``sdk.aio``) runs every call on one worker thread for you. After ``close()``
    the calls that read or change its partitions (``poll``, ``assign``, ``subscribe``,
    ``commit``, ``seek``, ``position``, the offset lookups) raise ClientClosedError.

    Every call is bounded, also when no node answers: a poll by its ``timeout_ms`` plus
    POLL_WORK_MS (5 s), ``commit``, ``committed``, the offset lookups, ``unsubscribe``
    and ``close`` by ``request_timeout_ms`` (docs/GROUPS.md).

    Options are checked here, before anything is sent (ValueError names the bound, TypeError
    a wrong type): ``fetch_max_wait_ms`` 0..FETCH_WAIT_MS_MAX (fabric/limits.py),
    ``fetch_min_bytes`` >= 0, ``fetch_max_bytes`` and ``partition_fetch_bytes_max`` > 0,
    the timeouts and intervals > 0 (``auto_commit_interval_ms`` >= 0), all within the wire's
    i32 (docs/PROTOCOL.md section 5.3). With ``group_id``, ``heartbeat_interval_ms`` must
    be below ``session_timeout_ms`` (ValueError here: with the default interval of 3 s, a
    session of 3 s or less). ``session_timeout_ms``'s range (6 s to 30 min) is the group
    coordinator's, as Kafka's broker bounds are: it refuses the first heartbeat, which
    ``subscribe()`` sends, so ``subscribe()`` raises ``InvalidRequestError`` naming the
    range (the first ``poll()`` does when ``subscribe()`` could not reach the coordinator).
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        *,
        auto_offset_reset: str = "earliest",
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 8 * 1024 * 1024,
        partition_fetch_bytes_max: int = 2 * 1024 * 1024,
        request_timeout_ms: int = 30_000,
        check_crc: bool = True,
        context: zmq.Context[Any] | None = None,
        group_id: str | None = None,
        group_instance_id: str | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 3_000,
        tag_filter: str | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        # Every option is checked before a socket is opened: a value the node refuses
        # (it answers every FETCH with INVALID_REQUEST) would otherwise only be logged,
        # and the consumer would return nothing for ever.
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be earliest, latest or none, got {auto_offset_reset!r}")
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = int_arg("fetch_max_wait_ms", fetch_max_wait_ms, 0, FETCH_WAIT_MS_MAX,
                                          high_name="FETCH_WAIT_MS_MAX")
        self.fetch_min_bytes = int_arg("fetch_min_bytes", fetch_min_bytes, 0, I32_MAX)
        # Above FETCH_BYTES_MAX (fabric/limits.py) the node reads that much: more is harmless.
        self.fetch_max_bytes = int_arg("fetch_max_bytes", fetch_max_bytes, 1, I32_MAX)
        self.partition_fetch_bytes_max = int_arg("partition_fetch_bytes_max", partition_fetch_bytes_max, 1, I32_MAX)
        self.request_timeout_ms = int_arg("request_timeout_ms", request_timeout_ms, 1, I32_MAX)
        self.check_crc = check_crc
        auto_commit_interval_ms = int_arg("auto_commit_interval_ms", auto_commit_interval_ms, 0, I32_MAX)
        # The group's session bounds are the coordinator's (nodes/group_state.py, which the
        # SDK may not import): it refuses the first heartbeat. The wire's i32 is checked here.
        session_timeout_ms = int_arg("session_timeout_ms", session_timeout_ms, 1, I32_MAX)
        heartbeat_interval_ms = int_arg("heartbeat_interval_ms", heartbeat_interval_ms, 1, I32_MAX)
        group_id = optional_str_arg("group_id", group_id)
        group_instance_id = optional_str_arg("group_instance_id", group_instance_id)
        parsed_filter = self._parse_tag_filter(tag_filter)
        meta_bootstrap = Bootstrap(bootstrap)
        self._group: GroupMember | None = None
        if group_id is not None:
            self._group = GroupMember(self, group_id, instance_id=group_instance_id,
                                      session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms)
        # security: CURVE keys for a secure cluster; None reads $FABRIC_KEY_FILE/$FABRIC_SERVER_KEY.
        self._conns = Connections(context, security=security or FROM_ENV)
        self._meta = MetadataClient(meta_bootstrap, self._conns)
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}  # next offset to hand to the caller
        self._fetch_positions: dict[TopicPartition, int] = {}  # next offset to ask a node for
        self._high_watermarks: dict[TopicPartition, int] = {}
        self._buffer: deque[RecordBatch | RawBatch] = deque()
        self._iteration: HandOut | None = None  # the records an iterator is handing out (HandOut)
        # pause(): replaced, never changed in place, so the fetch plan below notices a
        # change by identity. Buffered entries of a paused partition wait in _parked, in
        # order, and go back to the buffer on resume(): _take and poll_raw_batches never
        # see them, so the hot path pays nothing for pausing.
        self._paused: frozenset[TopicPartition] = frozenset()
        self._parked: dict[TopicPartition, list[RecordBatch | RawBatch]] = {}
        # Set by a wrapper that cannot read a paused partition (sdk.OrderedConsumer): why.
        self._pause_refused = ""
        # corr -> node, sent, {tp: pos}, Connections.drops(node) when sent
        self._in_flight: dict[int, tuple[str, float, dict[TopicPartition, int], int]] = {}
        self._busy_nodes: set[str] = set()
        self._fetch_turns: dict[str, int] = {}  # node address -> fetches sent to it (their order turns)
        # The assigned partitions not paused, by leader address, for the metadata, the
        # assignment list and the paused set it was made from (all three are replaced, never
        # changed in place): a poll sends fetches several times, and rebuilding this each
        # time was about a tenth of a consumer's CPU per small fetch answer (cProfile;
        # docs/BENCHMARKS.md, "End to end at low rates").
        self._plan: tuple[Any, list[TopicPartition], frozenset[TopicPartition],
                          dict[str, list[TopicPartition]], bool] | None = None
        self._refresh_needed = True
        # An assigned topic the last re-read of the map refused (_refused_topic): poll()
        # raises it before it hands out anything, so no position moves past records unseen.
        self._refused: errors.FabricError | None = None
        self._refresh_warned_s = -math.inf
        self._refresh_failures = 0  # since the last warning
        self._last_recheck_s = 0.0
        self._dropped = DroppedNodes()  # nodes whose connection dropped: their fetches are suspect
        self._closed = False
        # Every request, map re-read and group call ends by this (time.monotonic()): set by
        # each public call from its own bound (_within), so none outlasts it.
        self._work_by_s = math.inf
        self._poll_work_s = max(POLL_WORK_MS, self._group.heartbeat_timeout_ms if self._group else 0) / 1000.0
        allocator.tune()  # fetched batches are large buffers (fabric/allocator.py)
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._next_auto_commit_s = time.monotonic() + auto_commit_interval_ms / 1000.0
        self._committed_positions: dict[TopicPartition, int] = {}
        self._tag_filter: TagFilter | None = parsed_filter
        self.filtered_bytes = 0  # bytes the nodes left out for our tag filter (never sent)
        # Strict-order ticks are skipped; sdk.OrderedConsumer turns this off to see them.
        self.skip_control_batches = True

    # -- assignment and positions -----------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]], *, refresh: bool = True) -> None:
        """Read exactly ``partitions`` (a list of TopicPartition or (topic, partition)).
        Not while subscribed to a group (``unsubscribe()`` first), as Kafka's consumer.
        A partition the topic lacks raises UnknownTopicOrPartitionError, after up to
        PARTITION_LEARN_WAIT_MS of asking again in case it was only just added. A topic
        METADATA lists with an error raises that error (UnknownTopicOrPartitionError for
        an unknown topic, AuthorizationFailedError, ...), a retriable one (LEADER_NOT_AVAILABLE
        for a topic just created) after asking again as long."""
        self._check_open("assign")
        if self._group is not None and self._group.subscribed:
            raise errors.InvalidRequestError(
                f"assign() while subscribed to group {self._group.group_id!r}: the group decides this member's "
                "partitions; call unsubscribe() first")
        self._assign(partitions, refresh=refresh)

    def _assign(self, partitions: Iterable[TopicPartition | tuple[str, int]], *, refresh: bool = True) -> None:
        tps = _tp_list("partitions", partitions)
        if refresh or any(tp.topic not in self._meta.metadata.topics for tp in tps):
            self._refresh(sorted({tp.topic for tp in tps}))
        self._await_partitions(tps)
        self._assigned = tps
        keep = set(tps)
        for d in (self._positions, self._fetch_positions):
            for tp in list(d):
                if tp not in keep:
                    del d[tp]
        self._buffer = deque(b for b in self._buffer if TopicPartition(b.topic, b.partition) in keep)
        if not self._paused <= keep:
            # A partition that leaves the assignment (assign(), a revocation, a loss) is no
            # longer paused: assigned again later, it is read (Kafka's consumer clears the
            # pause state on reassignment too). The ones still assigned stay paused.
            self._paused = self._paused & keep
            self._parked = {tp: entries for tp, entries in self._parked.items() if tp in keep}

    def _await_partitions(self, tps: list[TopicPartition]) -> None:
        """Return once the metadata lists each of ``tps`` (their partition numbers are
        checked non-negative already). One past its topic's count may have just been added
        and not yet reached the node asked: ask again for up to PARTITION_LEARN_WAIT_MS,
        then raise UnknownTopicOrPartitionError. A topic METADATA lists with an error is
        waited on as long when the error is retriable (LEADER_NOT_AVAILABLE: just created;
        NODE_NOT_READY), then raises it; any other error raises at once
        (UnknownTopicOrPartitionError for an unknown topic, AuthorizationFailedError, ...)."""
        topics = sorted({tp.topic for tp in tps})
        deadline = min(time.monotonic() + PARTITION_LEARN_WAIT_MS / 1000.0, self._work_by_s)
        while beyond := [tp for tp in tps
                         if tp.partition >= self._topic_within(tp.topic, deadline).partition_count]:
            if time.monotonic() >= deadline:
                tp = beyond[0]
                raise errors.UnknownTopicOrPartitionError(f"topic {tp.topic!r} has no partition {tp.partition}")
            time.sleep(PARTITION_LEARN_PAUSE_S)
            self._refresh(topics)

    def _topic_within(self, name: str, deadline_s: float) -> TopicMetadata:
        """The map of topic ``name``; a retriable error METADATA lists it with (a topic just
        created is LEADER_NOT_AVAILABLE until the node asked has learned all of it) asked
        about again every PARTITION_LEARN_PAUSE_S until ``deadline_s``, then raised."""
        while True:
            try:
                return self._meta.topic(name)  # asks again while the map has none
            except errors.FabricError as exc:
                if not exc.retriable or time.monotonic() + PARTITION_LEARN_PAUSE_S >= deadline_s:
                    raise
            time.sleep(PARTITION_LEARN_PAUSE_S)

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    # -- consumer groups (the machinery is in sdk/_group.py) ----------------------------------
    def set_tag_filter(self, tag_filter: str | None) -> None:
        """Deliver only records whose tags match, e.g. ``"paid || refunded"`` (grammar in
        docs/GROUPS.md). Nodes skip batches that cannot match; ``poll()`` filters exactly.
        Positions and commits still move past filtered-out records."""
        self._tag_filter = self._parse_tag_filter(tag_filter)

    @staticmethod
    def _parse_tag_filter(tag_filter: str | None) -> TagFilter | None:
        text = optional_str_arg("tag_filter", tag_filter)
        return TagFilter(text) if text else None

    def subscribe(self, topics: Iterable[str] | None = None, *, pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None, tag_filter: str | None = None) -> None:
        """Join the group and read the partitions it gives this member: ``topics`` by name
        and/or every topic whose whole name matches ``pattern`` (an RE2 regular expression,
        as the nodes evaluate it: no backreferences or lookaround). New topics
        and partitions are picked up. A named topic that does not exist is no error (as in
        Kafka): polls return nothing until it is created, and its partitions are assigned
        at the member's next heartbeat after that. ``listener`` hears of
        revoked/assigned/lost partitions (``ConsumerRebalanceListener``: plain methods;
        an ``async def`` hook is a TypeError). The first heartbeat is sent here, so this
        raises what the coordinator refuses (``session_timeout_ms`` out of its range)."""
        self._check_open("subscribe")
        group = self._require_group("subscribe()")
        if isinstance(topics, str):
            topics = [topics]
        topic_list = None if topics is None else names_arg("topics", topics)
        pattern = optional_str_arg("pattern", pattern)
        if tag_filter is not None:
            self.set_tag_filter(tag_filter)
        topics = topic_list
        group.subscribe(topics, pattern, listener)
        with self._within(self._poll_work_s):
            group.tick()

    def unsubscribe(self) -> None:
        """Stop reading, as Kafka's ``unsubscribe()``: in a group, commit what was handed out
        (with auto commit) and leave at once (the listener hears the partitions revoked;
        the group hands them to others); the partitions of ``assign()`` are dropped too.
        ``subscribe()`` or ``assign()`` may follow; a second call does nothing."""
        self._check_open("unsubscribe")
        group = self._group
        if group is not None and group.subscribed:
            with self._within(self.request_timeout_ms / 1000.0):
                if group.owned:
                    self._auto_commit(force=True)
                group.leave(rejoin_later=True)
        self._assign([], refresh=False)

    def commit(self, offsets: CommitOffsets | None = None) -> None:
        """Commit ``offsets`` (next offset to read, optionally with a metadata string: a
        ``(offset, "metadata")`` pair or an ``OffsetAndMetadata``), or the positions of
        everything ``poll()`` has handed out. Returns once the commit is durable. Inside a
        ``for record in consumer`` (or ``async for``) body, the positions stop at the
        record being handled: ``commit()`` covers the records before it, and this one is
        read again after a restart; ``commit({TopicPartition(record.topic,
        record.partition): record.offset + 1})`` covers it too."""
        self._check_open("commit")
        group = self._require_group("commit()")
        group.raise_if_fenced()  # first: a fenced member holds nothing, so there may be nothing to send
        if offsets is None:
            wanted = {tp: (pos, "") for tp, pos in self._positions.items() if tp in set(self._assigned)}
        else:
            wanted = _commit_offsets(offsets)
        in_group = bool(group.subscribed and group.member_id)
        if in_group and offsets is not None:
            # The coordinator takes a member's commits only for partitions it holds (so a
            # member cannot move offsets under another one), answering FENCED_MEMBER_EPOCH
            # (docs/GROUPS.md): the same error, with a message that says which and why.
            foreign = sorted((tp for tp in wanted if tp not in group.owned), key=str)
            if foreign:
                raise errors.FencedMemberEpochError(
                    f"commit() of {', '.join(map(str, foreign[:5]))}: not assigned to this member of group "
                    f"{group.group_id!r} (assignment: {sorted(group.owned, key=str)})")
        with self._within(self.request_timeout_ms / 1000.0):
            group.commit(wanted, in_group=in_group)
        for tp, (offset, _meta) in wanted.items():
            self._committed_positions[tp] = offset

    def commit_async(self, offsets: CommitOffsets | None = None,
                     callback: Any = None) -> None:
        """Commit without raising: errors go to ``callback(offsets, exception)`` (or the log).
        Requests on a consumer are sequential, so this returns once the node answered."""
        self._check_open("commit_async")
        if callback is not None and not callable(callback):  # before anything is committed, as send() checks
            raise TypeError(f"callback must be callable or None, not {type(callback).__name__}")
        try:
            self.commit(offsets)
        except errors.FabricError as exc:
            if callback is None:
                log.warning("async commit failed: %s", exc)
            else:
                callback(offsets, exc)
            return
        if callback is not None:
            callback(offsets, None)

    @overload
    def committed(self, partition: TopicPartition | tuple[str, int], *,
                  metadata: Literal[False] = False) -> int | None: ...

    @overload
    def committed(self, partition: TopicPartition | tuple[str, int], *,
                  metadata: Literal[True]) -> OffsetAndMetadata | None: ...

    @overload  # a flag known only at run time (a wrapper passing it on)
    def committed(self, partition: TopicPartition | tuple[str, int], *,
                  metadata: bool) -> int | OffsetAndMetadata | None: ...

    def committed(self, partition: TopicPartition | tuple[str, int], *,
                  metadata: bool = False) -> int | OffsetAndMetadata | None:
        """The group's committed offset for the partition (None if never committed). With
        ``metadata=True`` (kafka-python's argument), an ``OffsetAndMetadata``: the offset
        and the metadata string committed with it, as Kafka's ``committed()`` returns."""
        self._check_open("committed")
        if not isinstance(metadata, bool):  # a truthy string would pick the other return type
            raise TypeError(f"metadata must be True or False, got {type(metadata).__name__}")
        tp = _as_tp(partition)
        group = self._require_group("committed()")
        with self._within(self.request_timeout_ms / 1000.0):
            found = group.committed([tp]).get(tp)
        if found is None:
            return None
        return OffsetAndMetadata(found[0], found[1]) if metadata else found[0]

    def _require_group(self, what: str) -> GroupMember:
        if self._group is None:
            raise errors.InvalidRequestError(f"{what} needs a consumer created with group_id=...")
        return self._group

    def _commit_before_revoke(self, tps: list[TopicPartition]) -> None:
        """Group hook: with auto commit, commit what was handed out of partitions about to go."""
        if self.enable_auto_commit:
            self._auto_commit(force=True, only=set(tps))

    def _drop(self, tps: list[TopicPartition]) -> None:
        """Group hook: stop reading ``tps`` and forget their buffered data."""
        gone = set(tps)
        self._assign([tp for tp in self._assigned if tp not in gone], refresh=False)
        for tp in gone:
            self._committed_positions.pop(tp, None)

    def _add(self, tps: list[TopicPartition]) -> None:
        """Group hook: start reading ``tps`` at the group's committed offsets (read first:
        if that fails nothing changes, and the caller retries)."""
        committed = self._require_group("a group assignment").committed(tps)
        self._refresh_needed = True
        self._assign([*self._assigned, *tps], refresh=False)
        for tp in tps:
            found = committed.get(tp)
            if found is not None:
                self.seek(tp, found[0])
                self._committed_positions[tp] = found[0]

    def _auto_commit(self, *, force: bool = False, only: set[TopicPartition] | None = None) -> None:
        if not self.enable_auto_commit or self._group is None or self._group.fenced:
            return  # fenced: the other consumer with our instance id owns the positions now
        now = time.monotonic()
        if not force and now < self._next_auto_commit_s:
            return
        self._next_auto_commit_s = now + self.auto_commit_interval_ms / 1000.0
        # Only positions poll() has handed out, and only those that moved.
        wanted = {tp: pos for tp, pos in self._positions.items()
                  if tp in set(self._assigned) and (only is None or tp in only)
                  and self._committed_positions.get(tp) != pos}
        if not wanted:
            return
        try:
            self.commit(wanted)
        except errors.FabricError as exc:
            log.warning("auto commit failed: %s", exc)

    def subscribe_all_partitions(self, topic: str) -> list[TopicPartition]:
        """Assign every partition of ``topic`` (no group coordination; that is a later feature).
        A topic METADATA lists with an error raises it, after up to PARTITION_LEARN_WAIT_MS
        of asking again when it is retriable, as ``assign()``."""
        self._check_open("subscribe_all_partitions")
        deadline = min(time.monotonic() + PARTITION_LEARN_WAIT_MS / 1000.0, self._work_by_s)
        meta = self._topic_within(str_arg("topic", topic), deadline)
        tps = [TopicPartition(topic, p) for p in range(meta.partition_count)]
        self.assign(tps)
        return tps

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Read ``partition`` (assigned) from ``offset`` on: 0 up to the wire's i64; an offset
        past the log end is answered OFFSET_OUT_OF_RANGE and reset (``auto_offset_reset``).
        ``seek_to_beginning``/``seek_to_end`` take no offset."""
        self._check_open("seek")
        tp = _as_tp(partition)
        offset = int_arg("offset", offset, 0, I64_MAX)
        if tp not in self._assigned:
            raise errors.InvalidRequestError(f"{tp} is not assigned")
        self._positions[tp] = offset
        self._fetch_positions[tp] = offset
        self._buffer = deque(b for b in self._buffer if (b.topic, b.partition) != (tp.topic, tp.partition))
        self._parked.pop(tp, None)  # paused: read from ``offset`` once resumed

    def pause(self, partitions: TopicPartition | tuple[str, int] | Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Stop reading ``partitions`` (one, or an iterable of them; each assigned, else
        InvalidRequestError, as Kafka's IllegalStateException, and nothing is paused) until
        ``resume()``. Kafka's ``pause()``: they stay assigned, are left out of fetches, and
        no poll, batch poll or iteration hands out a record of theirs, not even one already
        fetched (an iteration stops handing out a partition's records at once). Their
        positions and committed offsets do not move, so auto commit and ``commit()`` go on
        committing them as they are, and heartbeats go on: a member with everything paused
        keeps polling to stay in its group. Data already fetched is kept, not fetched again
        (Kafka's Java consumer since KAFKA-7548; before, it dropped it), and handed out after
        ``resume()`` from the position on: in order, nothing skipped, nothing twice. (What an
        iteration had polled but not handed out, and the answer of a fetch that was out, are
        fetched again from the position instead.) ``seek()`` works while paused and takes
        effect on resume. A partition revoked (or lost) while paused is no longer paused if
        the group gives it back (as Kafka's); the ones kept stay paused."""
        self._check_open("pause")
        if self._pause_refused:
            raise errors.InvalidRequestError(self._pause_refused)
        tps = self._assigned_only_list("pause", partitions)
        new = {tp for tp in tps if tp not in self._paused}
        if not new:
            return
        self._paused = self._paused | new
        kept: deque[RecordBatch | RawBatch] = deque()
        for entry in self._buffer:
            tp = TopicPartition(entry.topic, entry.partition)
            if tp in new:
                self._parked.setdefault(tp, []).append(entry)
            else:
                kept.append(entry)
        self._buffer = kept

    def resume(self, partitions: TopicPartition | tuple[str, int] | Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read paused ``partitions`` again (one, or an iterable; each assigned, else
        InvalidRequestError): what was fetched before the pause comes first, then fetches
        from where that ends, so they are handed out from their positions on, in order.
        Resuming a partition that is not paused does nothing."""
        self._check_open("resume")
        tps = self._assigned_only_list("resume", partitions)
        back = [tp for tp in dict.fromkeys(tps) if tp in self._paused]
        if not back:
            return
        self._paused = self._paused.difference(back)
        for tp in back:
            self._buffer.extend(self._parked.pop(tp, ()))

    def paused(self) -> set[TopicPartition]:
        """The partitions paused now (a copy), as Kafka's ``paused()``."""
        return set(self._paused)

    def _assigned_only_list(self, what: str, partitions: object) -> list[TopicPartition]:
        """``partitions`` of pause()/resume(), all checked before any changes."""
        tps = _one_or_many("partitions", partitions)
        for tp in tps:
            if tp not in self._assigned:
                raise errors.InvalidRequestError(f"{what}() of {tp}: it is not assigned")
        return tps

    def _assigned_only(self, partitions: tuple[TopicPartition | tuple[str, int], ...]) -> list[TopicPartition]:
        """``partitions`` (all assigned ones if none), refused before any request if one is
        not assigned: seek() would refuse it only after the offsets were looked up."""
        tps = [_as_tp(p) for p in partitions] or list(self._assigned)
        for tp in tps:
            if tp not in self._assigned:
                raise errors.InvalidRequestError(f"{tp} is not assigned")
        return tps

    def seek_to_beginning(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        self._check_open("seek_to_beginning")
        tps = self._assigned_only(partitions)
        for tp, offset in self._list_offsets(tps, apis.EARLIEST_TIMESTAMP).items():
            self.seek(tp, offset)

    def seek_to_end(self, *partitions: TopicPartition | tuple[str, int]) -> None:
        self._check_open("seek_to_end")
        tps = self._assigned_only(partitions)
        for tp, offset in self._list_offsets(tps, apis.LATEST_TIMESTAMP).items():
            self.seek(tp, offset)

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The first offset at or after each timestamp (ms), or -1 where there is none."""
        self._check_open("offsets_for_times")
        if not isinstance(timestamps, Mapping):
            raise TypeError(f"timestamps must be a dict of partition to ms, got {type(timestamps).__name__}")
        # Negative timestamps are LIST_OFFSETS' codes for earliest/latest: not times to ask.
        checked = {_as_tp(tp): int_arg("timestamp", ts, 0, I64_MAX) for tp, ts in timestamps.items()}
        out: dict[TopicPartition, int] = {}
        for tp, ts in checked.items():
            out.update(self._list_offsets([tp], ts))
        return out

    def beginning_offsets(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> dict[TopicPartition, int]:
        self._check_open("beginning_offsets")
        return self._list_offsets(_tp_list("partitions", partitions), apis.EARLIEST_TIMESTAMP)

    def end_offsets(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> dict[TopicPartition, int]:
        self._check_open("end_offsets")
        return self._list_offsets(_tp_list("partitions", partitions), apis.LATEST_TIMESTAMP)

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll()`` hands out for an assigned partition
        (InvalidRequestError for one not assigned, as Kafka's IllegalStateException)."""
        self._check_open("position")
        tp = _as_tp(partition)
        if tp not in self._assigned:
            raise errors.InvalidRequestError(f"{tp} is not assigned")
        if tp not in self._positions:
            self._reset_position(tp)
        return self._positions[tp]

    def _list_offsets(self, tps: list[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
        """One LIST_OFFSETS per leader, for all its partitions: one per partition, each
        waiting for the last, took a consumer's first poll of 1,940 partitions 1.2-1.9 s
        (docs/BENCHMARKS.md, "Many partitions"). Retriable errors are retried (after a
        metadata refresh) for the partitions that had them, until the request timeout."""
        with self._within(self.request_timeout_ms / 1000.0):
            return self._list_offsets_within(tps, timestamp)

    def _list_offsets_within(self, tps: list[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        pending = list(dict.fromkeys(tps))
        while pending:
            try:
                by_leader: dict[str, list[TopicPartition]] = {}
                for tp in pending:
                    address = self._meta.metadata.leader_address(tp.topic, tp.partition)
                    if address is None:
                        # No such topic or partition is an answer, not a reason to wait out the
                        # request timeout; one just added is waited for as assign() does.
                        self._await_partitions([tp])
                        raise errors.LeaderNotAvailableError(f"no leader for {tp}")
                    by_leader.setdefault(address, []).append(tp)
                for address, led in by_leader.items():
                    message = self._conns.request(
                        address, ApiKey.LIST_OFFSETS,
                        {"partitions": [{"topic": tp.topic, "partition": tp.partition, "timestamp": timestamp}
                                        for tp in led]},
                        timeout_ms=self._request_ms(self.request_timeout_ms),
                        wait_connect_ms=self._request_ms(METADATA_CONNECT_MS),
                    )
                    # By name, not by position: an answer with fewer or more rows than asked
                    # (a buggy or version-skewed node) raised a bare ValueError from zip.
                    results = {(r["topic"], r["partition"]): r for r in message.body["partitions"]}
                    for tp in led:
                        result = results.get((tp.topic, tp.partition))
                        if result is None:
                            raise errors.UnknownServerError(f"the LIST_OFFSETS answer of {address} left out {tp}")
                        errors.raise_for_code(result["error"], f"list offsets for {tp}")
                        # -1 means "none" only for a time; a negative log start or end became
                        # the position, and seek_to_end() or the next commit raised ValueError.
                        if not (-1 if timestamp >= 0 else 0) <= result["offset"] <= batch_format.OFFSET_MAX:
                            raise errors.UnknownServerError(
                                f"the LIST_OFFSETS answer of {address} gave {tp} offset {result['offset']}")
                        out[tp] = result["offset"]
                pending = []
            except errors.FabricError as exc:
                if not exc.retriable or time.monotonic() >= self._work_by_s:
                    raise
                pending = [tp for tp in pending if tp not in out]
                time.sleep(min(0.1, max(0.0, self._work_by_s - time.monotonic())))
                try:
                    self._refresh(sorted({t.topic for t in pending}))
                except errors.NoBrokersAvailableError:
                    pass  # the next round asks again, or the bound ends it with the last error
        return out

    def _reset_position(self, tp: TopicPartition) -> None:
        self._reset_positions([tp])

    def _reset_positions(self, tps: list[TopicPartition]) -> None:
        if self.auto_offset_reset == "none":
            raise errors.OffsetOutOfRangeError(f"{tps[0]} has no valid position and auto_offset_reset=none")
        ts = apis.EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" else apis.LATEST_TIMESTAMP
        for tp, offset in self._list_offsets(tps, ts).items():
            self._positions[tp] = offset
            self._fetch_positions[tp] = offset

    # -- polling ----------------------------------------------------------------------------
    def poll_batches(self, timeout_ms: int = 1000, max_records: int = 1_000_000) -> list[RecordBatch]:
        """Whole decoded batches (columns), the fastest way to read. Positions advance past them."""
        if self._tag_filter is not None:
            raise errors.InvalidRequestError("with a tag filter read records with poll(): batches are not filtered")
        _poll_args(timeout_ms, max_records)
        return self._poll_batches(timeout_ms, max_records)

    def _poll_batches(self, timeout_ms: int, max_records: int) -> list[RecordBatch]:
        with self._within(max(0, timeout_ms) / 1000.0 + self._poll_work_s):
            if not self._wait_for_data(timeout_ms):
                return []
            taken = self._take(max_records)
            self._send_fetches()  # ask for the next data now, so it travels while the caller works
            return taken

    def _wait_for_data(self, timeout_ms: int) -> bool:
        """Keep fetches going until something is buffered or ``timeout_ms`` passes."""
        if self._closed:
            raise errors.ClientClosedError("poll after close()")
        if self._iteration is not None:
            # An iteration left early (its records not all handed out) is read on from
            # where it stopped. Here rather than in the iterator's cleanup, which may come
            # later (an async generator is closed by the loop after the caller's next call).
            self._refetch(self._iteration.unfinished())
            self._iteration = None
        group = self._group
        if not self._assigned and (group is None or not group.subscribed):
            raise errors.InvalidRequestError("no partitions assigned; call assign() or subscribe() first")
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        self._auto_commit()
        while True:
            if group is not None:
                group.tick()
            self._send_fetches()
            if self._refused is not None:
                refused, self._refused = self._refused, None
                raise refused
            if self._buffer:
                return True
            # Rounded up: a wait truncated to 0 ms would return with part of the time left,
            # and a caller looping until its own deadline (a tag-filtered poll) would spin.
            remaining_ms = math.ceil((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return False
            self._receive(min(remaining_ms, 100))
            self._check_timeouts()

    def poll_raw_batches(self, timeout_ms: int = 1000) -> list[RawBatch]:
        """Fetched batches undecoded, for columnar readers (Arrow): no per-record Python work.

        Positions advance past each batch handed out, as with the other poll methods; the
        caller checks the CRC and decompresses (``batch.column_view`` does both).
        """
        if self._tag_filter is not None:
            raise errors.InvalidRequestError("with a tag filter read records with poll(): raw batches are not filtered")
        _poll_args(timeout_ms, 1)
        with self._within(max(0, timeout_ms) / 1000.0 + self._poll_work_s):
            return self._poll_raw_batches(timeout_ms)

    def _poll_raw_batches(self, timeout_ms: int) -> list[RawBatch]:
        if not self._wait_for_data(timeout_ms):
            return []
        out: list[RawBatch] = []
        while self._buffer:
            entry = self._buffer[0]
            if isinstance(entry, RecordBatch) and not len(entry):  # a marker past skipped ticks
                self._buffer.popleft()
                self._positions[TopicPartition(entry.topic, entry.partition)] = entry.next_offset
                continue
            if not isinstance(entry, RawBatch):
                break
            self._buffer.popleft()
            header = batch_format.read_header(entry.buf)
            self._positions[TopicPartition(entry.topic, entry.partition)] = header.next_offset
            out.append(entry)
        if not out and self._buffer:
            raise errors.InvalidRequestError(
                "records of a partly taken batch are waiting: read them with poll() before poll_raw_batches()")
        self._send_fetches()
        return out

    def poll(self, timeout_ms: int = 1000, max_records: int = 10_000) -> list[Record]:
        """Up to ``max_records`` records, waiting at most ``timeout_ms`` for the first. The
        poll's other work (auto commit, a heartbeat, map re-reads) ends within POLL_WORK_MS
        after that (or the group's heartbeat wait if longer), also when no node answers."""
        _poll_args(timeout_ms, max_records)
        out: list[Record] = []
        tag_filter = self._tag_filter
        if tag_filter is None:
            for batch in self._poll_batches(timeout_ms, max_records):
                out.extend(batch.records())
            return out
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        while True:
            for batch in self._poll_batches(max(0, math.ceil((deadline - time.monotonic()) * 1000)), max_records):
                out.extend(r for r in batch.records() if tag_filter.matches(record_tags(r.headers)))
            if out or time.monotonic() >= deadline:
                return out

    def __iter__(self) -> Iterator[Record]:
        """Records one by one until ``close()``. Unlike ``poll()``, which moves each position
        past everything it returns, iteration moves a partition's position past each record
        once the caller comes back for the next one. So a loop left early, by ``break`` or
        by an exception from the caller's handling, commits (auto-commit, ``close()``) only
        the records the caller finished, and the rest, the one it was handling included, is
        read again: by this consumer if it iterates again, or by the member that gets the
        partition (at least once, never skipped)."""
        while not self._closed:
            yield from self._hand_out(self.poll_for_hand_out(1000))

    def poll_for_hand_out(self, timeout_ms: int) -> HandOut:
        """``poll()`` for an iterator: the positions stay at each partition's first record
        returned (in one call, so a commit can never come between)."""
        return HandOut(self, self.poll(timeout_ms=timeout_ms))

    def between_records_due(self) -> bool:
        """Whether an iterator must call ``between_records()`` before its next record."""
        if self._closed:
            return False  # closed inside the loop: nothing more is handed out (HandOut.take)
        if self._group is not None and self._group.due():
            return True
        return self.enable_auto_commit and time.monotonic() >= self._next_auto_commit_s

    def between_records(self) -> None:
        """What a poll does first (auto commit, heartbeat, the session clock), done while
        an iterator hands out one poll's records: a poll returns up to 10,000 of them, and
        a handler taking longer than the session for all of them would otherwise be
        expired while it still hands out records of partitions the group has given to
        another member. A partition revoked or lost here gets no more of these records
        (``HandOut.take``); a commit covers only the records the caller finished."""
        with self._within(self._poll_work_s):
            self._auto_commit()
            if self._group is not None:
                self._group.tick()

    def _hand_out(self, hand_out: HandOut) -> Iterator[Record]:
        # Left early, nothing to clean up here: the next poll of any kind reads on from
        # where the caller stopped (``_wait_for_data``), and only a poll fetches.
        for record in hand_out.records:
            if self.between_records_due():
                self.between_records()
            if hand_out.take(record):
                yield record
                hand_out.done(record)  # the caller came back for more: it is done with it
        hand_out.finish()

    def _refetch(self, positions: dict[TopicPartition, int]) -> None:
        """Read these partitions again from these positions (what an iteration left early
        had taken past them), unless the consumer closed or lost them meanwhile."""
        for tp, offset in positions.items():
            if not self._closed and tp in self._assigned and self._positions.get(tp) == offset:
                self.seek(tp, offset)

    def _take(self, max_records: int) -> list[RecordBatch]:
        out: list[RecordBatch] = []
        taken = 0
        while self._buffer and taken < max_records:
            entry = self._buffer[0]
            batch = entry if isinstance(entry, RecordBatch) else self._decode(entry)
            room = max_records - taken
            if len(batch) > room:
                gid = batch.global_id_base
                head = RecordBatch(batch.topic, batch.partition, batch.base_offset, batch.timestamps[:room],
                                   batch.keys[:room], batch.values[:room], batch.headers[:room],
                                   batch.timestamp_type, gid)
                self._buffer[0] = RecordBatch(batch.topic, batch.partition, batch.base_offset + room,
                                              batch.timestamps[room:], batch.keys[room:], batch.values[room:],
                                              batch.headers[room:], batch.timestamp_type, gid + room if gid >= 0 else -1)
                batch = head
            else:
                self._buffer.popleft()
            self._positions[TopicPartition(batch.topic, batch.partition)] = batch.next_offset
            out.append(batch)
            taken += len(batch)
        return out

    def _decode(self, raw: RawBatch) -> RecordBatch:
        decoded = batch_format.decode_batch(raw.buf, check_crc=self.check_crc)
        skip = raw.skip
        timestamp_type = 1 if decoded.header.attributes & batch_format.TIMESTAMP_LOG_APPEND else 0
        gid = decoded.header.global_id_base
        if not skip:
            return RecordBatch(raw.topic, raw.partition, decoded.header.base_offset, decoded.timestamps,
                               decoded.keys, decoded.values, decoded.headers, timestamp_type, gid)
        return RecordBatch(raw.topic, raw.partition, decoded.header.base_offset + skip, decoded.timestamps[skip:],
                           decoded.keys[skip:], decoded.values[skip:], decoded.headers[skip:], timestamp_type,
                           gid + skip if gid >= 0 else -1)

    def _send_fetches(self) -> None:
        if self._refresh_needed:
            try:
                self._refresh(sorted({tp.topic for tp in self._assigned}))
                self._refresh_needed = False
                self._refresh_warned_s, self._refresh_failures = -math.inf, 0
            except errors.FabricError as exc:
                self._refresh_failures += 1
                now = time.monotonic()
                if now - self._refresh_warned_s >= REFRESH_WARNING_INTERVAL_S:
                    more = f" ({self._refresh_failures} failures since the last warning)" \
                        if self._refresh_failures > 1 else ""
                    log.warning("metadata refresh failed: %s%s", exc, more)
                    self._refresh_warned_s, self._refresh_failures = now, 0
                return
            self._refused = self._refused_topic()
        if len(self._buffer) >= BUFFERED_BATCHES_MAX:
            return  # the caller is behind; fetching more would only grow memory
        leaders, leaderless = self._fetch_plan()
        if leaderless:
            self._refresh_needed = True
        for address, led in leaders.items():
            unset = [tp for tp in led if tp not in self._fetch_positions]
            if unset:  # new partitions' positions are set now, all in one request, even if the node is busy
                try:
                    self._reset_positions(unset)
                except errors.RetriableError:
                    self._refresh_needed = True
            tps = [tp for tp in led if tp in self._fetch_positions]
            if not tps or address in self._busy_nodes:
                continue
            # The node fills the answer in this order until max_bytes (docs/PROTOCOL.md
            # 5.3): a fixed order would serve the first partitions with a backlog and starve
            # the rest, so each fetch to a node starts one partition further on (Kafka's
            # consumer rotates its fetch order too, KIP-74).
            turn = self._fetch_turns[address] = self._fetch_turns.get(address, -1) + 1
            first = turn % len(tps)
            positions = {tp: self._fetch_positions[tp] for tp in tps[first:] + tps[:first]}
            body = {
                "replica_id": apis.CONSUMER_REPLICA_ID,
                "max_wait_ms": self.fetch_max_wait_ms,
                "min_bytes": self.fetch_min_bytes,
                "max_bytes": self.fetch_max_bytes,
                "partitions": [
                    {"topic": tp.topic, "partition": tp.partition, "fetch_offset": off,
                     "partition_bytes_max": self.partition_fetch_bytes_max,
                     "current_leader_epoch": apis.ANY_LEADER_EPOCH}
                    for tp, off in positions.items()
                ],
            }
            correlation_id = self._conns.next_id()
            version = 0
            if self._tag_filter is not None:
                body["tag_filter"] = self._tag_filter.text  # FETCH v1: the node skips batches that cannot match
                version = 1
            try:
                self._conns.send(address, apis.encode_request(ApiKey.FETCH, body, correlation_id, api_version=version))
            except errors.FabricError:
                self._refresh_needed = True
                continue
            self._in_flight[correlation_id] = (address, time.monotonic(), positions, self._conns.drops(address))
            self._busy_nodes.add(address)

    def _refused_topic(self) -> errors.FabricError | None:
        """After a re-read of the map: the error of an assigned topic (not paused) it lists
        with one that is not retriable, for ``poll()`` to raise as it raises a FETCH refusal
        (AuthorizationFailedError once the principal may no longer describe it, as Kafka's
        TopicAuthorizationException), each time the map is read again. Retriable errors
        keep the map known and are waited on; UNKNOWN_TOPIC_OR_PARTITION (a node that has
        not learned the topic, or one deleted) and UNKNOWN_SERVER_ERROR are waited on too,
        as the same codes in a FETCH answer are."""
        listed = self._meta.metadata.topics
        for topic in sorted({tp.topic for tp in self._assigned if tp.topic not in listed and tp not in self._paused}):
            exc = self._meta.topic_error(topic)
            if not exc.retriable and not isinstance(exc, (errors.UnknownTopicOrPartitionError,
                                                          errors.UnknownServerError)):
                return exc
        return None

    def _fetch_plan(self) -> tuple[dict[str, list[TopicPartition]], bool]:
        """The assigned partitions not paused by leader address, and whether any has no
        known leader. Made again only when the map, the assignment or the paused set changed."""
        metadata, assigned, paused = self._meta.metadata, self._assigned, self._paused
        plan = self._plan
        if plan is None or plan[0] is not metadata or plan[1] is not assigned or plan[2] is not paused:
            leaders: dict[str, list[TopicPartition]] = {}
            leaderless = False
            for tp in assigned:
                if tp in paused:
                    continue
                address = metadata.leader_address(tp.topic, tp.partition)
                if address is None:
                    leaderless = True
                else:
                    leaders.setdefault(address, []).append(tp)
            plan = self._plan = (metadata, assigned, paused, leaders, leaderless)
        return plan[3], plan[4]

    def _receive(self, timeout_ms: int) -> None:
        for address, frames in self._conns.poll(timeout_ms):
            try:
                message = apis.decode_response([f.bytes if i < 2 else f.buffer for i, f in enumerate(frames)])
            except errors.FabricError as exc:
                log.warning("undecodable fetch response from %s: %s", address, exc)
                continue
            if message.header.api_key != ApiKey.FETCH:
                continue  # another API's answer with a fetch's correlation id (a buggy node): not ours
            flight = self._in_flight.pop(message.header.correlation_id, None)
            if flight is None:
                continue
            self._busy_nodes.discard(flight[0])
            if message.header.error_code:
                cls = errors.error_for_code(message.header.error_code)
                if not cls.retriable and cls not in (errors.UnknownTopicOrPartitionError, errors.UnknownServerError):
                    # A refusal (no consume ACL, a bad request) is the same on every retry:
                    # raised from poll(), as Kafka's consumer does, not retried in a busy loop.
                    # A node's internal error may pass: it is retried, as Kafka's fetcher does.
                    raise cls(str(message.body.get("message") or f"fetch from {address} refused"))
                log.warning("fetch from %s failed: %s", address, message.body.get("message"))
                self._refresh_needed = True
                continue
            self._apply_fetch(message, flight[2])

    def _apply_fetch(self, message: apis.Message, positions: dict[TopicPartition, int]) -> None:
        frames = message.batches
        index = 0
        for result in message.body["partitions"]:
            tp = TopicPartition(result["topic"], result["partition"])
            raw = frames[index : index + result["batch_count"]]
            index += result["batch_count"]
            if tp not in positions or self._fetch_positions.get(tp) != positions[tp]:
                continue  # the caller seeked while this fetch was out: drop its data
            if self._paused and tp in self._paused:
                # Paused while this fetch was out: its data is dropped and its fetch position
                # stays where this fetch started, the end of what is parked, so the fetch
                # after resume() asks for exactly what follows (no gap, nothing twice).
                continue
            error = result["error"]
            if error:
                cls = errors.error_for_code(error)
                if cls is errors.OffsetOutOfRangeError:
                    if self.auto_offset_reset == "none":  # nothing is reset: the next poll raises, until a seek()
                        log.warning("%s: offset %d out of range (auto_offset_reset='none': seek() to go on)", tp,
                                    positions[tp])
                    else:
                        log.warning("%s: offset %d out of range; resetting to %s", tp, positions[tp],
                                    self.auto_offset_reset)
                    self._positions.pop(tp, None)
                    self._fetch_positions.pop(tp, None)
                elif cls.retriable or cls is errors.UnknownTopicOrPartitionError:
                    self._refresh_needed = True
                else:
                    raise cls(f"fetch {tp} failed")
                continue
            self._high_watermarks[tp] = result["high_watermark"]
            position = positions[tp]
            for buf in raw:
                header = batch_format.read_header(buf)
                if header.record_count < 1 or not 0 <= header.base_offset <= batch_format.OFFSET_MAX - header.record_count:
                    # base_offset is outside the CRC (the leader stamps it): checked here, where
                    # positions move by it, so that a node's bad header is CORRUPT_MESSAGE
                    # from poll() rather than a struct error from the next FETCH's encoding.
                    raise errors.CorruptMessageError(
                        f"{tp}: batch of {header.record_count} records at offset {header.base_offset}: "
                        f"offsets outside [0, {batch_format.OFFSET_MAX}]")
                skip = position - header.base_offset
                if skip >= header.record_count:
                    continue
                if header.attributes & batch_format.ATTRIBUTE_CONTROL and self.skip_control_batches:
                    # A strict-order tick: takes an offset, holds no record. The caller's
                    # position moves past it too, so "position >= end offset" still means
                    # "read everything": at once with nothing of this partition waiting for
                    # the caller, else by an empty marker once the caller gets there (without
                    # it, a tick fetched with records left the position short of the end).
                    position = header.next_offset
                    if any(b.partition == tp.partition and b.topic == tp.topic for b in self._buffer):
                        self._buffer.append(_position_marker(tp, position))
                    else:
                        self._positions[tp] = position
                    continue
                self._buffer.append(RawBatch(tp.topic, tp.partition, buf, max(skip, 0)))
                position = header.next_offset
            skipped_to = result.get("next_fetch_offset", -1)
            self.filtered_bytes += result.get("filtered_bytes", 0)
            if skipped_to > position:
                # The node left out batches that cannot match our tag filter: an empty marker
                # moves the position (and so commits and lag) past them once we get there.
                self._buffer.append(_position_marker(tp, skipped_to))
                position = skipped_to
            self._fetch_positions[tp] = position

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        overdue_s = (self.fetch_max_wait_ms + FETCH_GRACE_MS) / 1000.0
        dropped = self._dropped.update(self._conns, now)

        def overdue(address: str, sent: float) -> bool:
            return now - sent > overdue_s or address in dropped

        if (any(overdue(a, sent) for a, sent, _p, _d in self._in_flight.values())
                and now - self._last_recheck_s > LEADER_RECHECK_INTERVAL_S):
            self._last_recheck_s = now
            # A long-poll that outlives its max_wait by this much: its leader may be dead
            # or paused. Look again; resend to a new leader instead of waiting the timeout.
            # Not from the silent leaders themselves: a paused one would hold the refresh
            # (and this poll, past its timeout_ms) for a whole metadata timeout.
            suspects = {a for a, sent, _p, _d in self._in_flight.values() if overdue(a, sent)}
            try:
                self._refresh(sorted({tp.topic for tp in self._assigned}), avoid=suspects)
            except errors.FabricError:
                pass
        for correlation_id, (address, sent, positions, drops) in list(self._in_flight.items()):
            moved = overdue(address, sent) and any(
                self._meta.metadata.leader_address(tp.topic, tp.partition) != address for tp in positions)
            # The connection the fetch went out on dropped (a node's heartbeat closes that of
            # a consumer stopped past client_heartbeat_timeout_ms) and a new one is up: the
            # answer went with the old one (PROTOCOL.md 5.3); fetch again now, not after
            # request_timeout_ms.
            lost = self._conns.lost_and_back(address, drops)
            if moved or lost or now - sent > (self.request_timeout_ms + self.fetch_max_wait_ms) / 1000.0:
                del self._in_flight[correlation_id]
                self._busy_nodes.discard(address)
                self._conns.drop(address)
                self._refresh_needed = True

    def high_watermark(self, partition: TopicPartition | tuple[str, int]) -> int:
        """The last high watermark a fetch reported for the partition (-1 if none yet)."""
        return self._high_watermarks.get(_as_tp(partition), -1)

    def _check_open(self, what: str) -> None:
        """Every call that reads or changes the consumer's partitions refuses once closed,
        as poll does (Kafka's consumer too): its sockets are gone, and an assign() that
        seemed to work would only fail at the next poll."""
        if self._closed:
            raise errors.ClientClosedError(f"{what}() after close()")

    @contextlib.contextmanager
    def _within(self, seconds: float) -> Iterator[None]:
        """Everything done inside (requests, map re-reads, group calls) ends within
        ``seconds`` from now, or by the bound of the call this one is part of."""
        outer = self._work_by_s
        self._work_by_s = min(outer, time.monotonic() + seconds)
        try:
            yield
        finally:
            self._work_by_s = outer

    def _deadline_s(self) -> float | None:
        """The current call's bound (``time.monotonic()``), None outside any."""
        return None if self._work_by_s == math.inf else self._work_by_s

    def _request_ms(self, timeout_ms: int) -> int:
        """``timeout_ms`` cut to what is left of the current call's bound; RequestTimedOutError
        (retriable) when nothing is left."""
        if self._work_by_s == math.inf:
            return timeout_ms
        left_ms = math.ceil((self._work_by_s - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise errors.RequestTimedOutError("the call ran out of its time (request_timeout_ms, or a poll's "
                                              "timeout_ms plus POLL_WORK_MS)")
        return min(timeout_ms, left_ms)

    def _refresh(self, topics: list[str] | None, avoid: Iterable[str] = ()) -> None:
        """Re-read the routing map, by the current call's bound."""
        self._meta.refresh(topics, avoid=avoid, deadline_s=self._deadline_s())

    def close(self) -> None:
        """Commit (with auto commit), leave the group at once (the listener hears its
        partitions revoked; the other members get them at their next heartbeat, which their
        polls send within their ``heartbeat_interval_ms``, without waiting for this one's
        session to time out; a static member's are kept for it instead), and close the sockets; within ``request_timeout_ms`` also when no node
        answers (what was not committed by then is not: the group's session timeout ends
        the membership)."""
        if self._closed:
            return
        try:
            if self._group is not None:
                try:
                    with self._within(self.request_timeout_ms / 1000.0):
                        if self._group.subscribed and self._group.owned:
                            self._auto_commit(force=True)
                        self._group.leave()
                except errors.FabricError as exc:
                    log.warning("leaving the group failed: %s", exc)
        finally:
            # Also when the listener's on_partitions_revoked raised (that comes out of this
            # call, after the leave): it left the consumer open, its sockets with it.
            self._closed = True
            self._conns.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

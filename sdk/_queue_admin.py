"""Queue administration, mixed into ``sdk.Admin``: create, delete, list, describe, redrive,
and deleting a queue's group.

A queue is a topic whose config says ``queue=true`` and carries the queue's settings
(docs/QUEUES.md), so creating and deleting are topic operations. ``describe_queue`` asks
each partition's leader for its counts; ``redrive`` moves dead letters back;
``delete_queue_group`` asks each leader to drop a group's state (QUEUE_DELETE_GROUP);
``purge_queue`` to settle what was sent so far (QUEUE_PURGE).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fabric import errors
from fabric.limits import PARTITIONS_MAX, REPLICATION_FACTOR_MAX, TOPIC_MESSAGE_BYTES_MAX
from fabric.protocol import apis
from fabric.protocol import queues as qp
from fabric.protocol.apis import ApiKey
from sdk._arguments import I64_MAX, int_arg, optional_str_arg, str_arg

if TYPE_CHECKING:
    from sdk._client import Connections, MetadataClient
    from sdk.admin import TopicDescription

QUEUE_SETTINGS: Final[tuple[str, ...]] = (
    "visibility_timeout_ms", "max_deliveries", "dead_letter", "message_ttl_ms", "max_messages", "max_bytes",
    "dedup_window_ms", "queue_group_retention_ms")
REDRIVE_GROUP: Final[str] = "__redrive"
REDRIVE_IDLE_MS: Final[int] = 1_000  # redrive stops once the dead-letter queue has been empty this long
DESCRIBE_RETRY_S: Final[float] = 0.1


@dataclass(frozen=True)
class QueuePartitionCounts:
    partition: int
    group: str  # "" for a queue nobody consumes yet
    visible: int
    in_flight: int
    delayed: int
    dead_lettered: int
    dropped: int  # expired by TTL, or poison with no dead-letter queue
    deduplicated: int
    oldest_age_ms: int  # -1: nothing waiting


@dataclass(frozen=True)
class QueueDescription:
    name: str
    group: str
    settings: dict[str, str]
    partitions: tuple[QueuePartitionCounts, ...]

    def total(self, field_name: str) -> int:
        return sum(getattr(p, field_name) for p in self.partitions)

    @property
    def oldest_age_ms(self) -> int:
        return max((p.oldest_age_ms for p in self.partitions), default=-1)


class QueueAdmin:
    _conns: Connections
    _meta: MetadataClient
    request_timeout_ms: int

    if TYPE_CHECKING:  # provided by sdk.admin.Admin
        def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3,
                         config: dict[str, Any] | None = None, *, strict_order: bool = False,
                         wait: bool = True) -> None: ...
        def delete_topic(self, name: str, *, wait: bool = True, timeout_s: float = 30.0) -> None: ...
        def describe_topics(self, names: list[str] | None = None) -> list[TopicDescription]: ...

    def create_queue(self, name: str, partitions: int = 1, replication_factor: int = 3, *,
                     visibility_timeout_ms: int = qp.VISIBILITY_TIMEOUT_MS_DEFAULT,
                     max_deliveries: int = qp.MAX_DELIVERIES_DEFAULT, dead_letter: str | None = None,
                     message_ttl_ms: int = 0, max_messages: int = 0, max_bytes: int = 0,
                     max_message_bytes: int = qp.QUEUE_MESSAGE_BYTES_DEFAULT,
                     dedup_window_ms: int = qp.DEDUP_WINDOW_MS_DEFAULT,
                     group_retention_ms: int = qp.QUEUE_GROUP_RETENTION_MS_DEFAULT, wait: bool = True) -> None:
        """A queue: a topic kept until consumed (no time retention) with queue settings.
        ``dead_letter``: a queue for poison messages, created when it does not exist yet,
        with the same partitions and ``max_message_bytes`` plus ``qp.DEAD_LETTER_ROOM_BYTES``
        (8 KiB, room for the ``fabric.dlq.*`` headers; 64 MiB at most); not itself and not an
        internal topic (``__...``). ``group_retention_ms``: a group idle this long (no
        receive, settle or live lease) is deleted (``queue_group_retention_ms``). Settings out of bounds raise InvalidQueueConfigError (or
        the topic's errors) before anything is created, the dead-letter queue included."""
        str_arg("name", name)
        dead_letter = optional_str_arg("dead_letter", dead_letter)
        int_arg("partitions", partitions, 1, PARTITIONS_MAX, high_name="PARTITIONS_MAX",
                 error=errors.InvalidPartitionsError)
        int_arg("replication_factor", replication_factor, 1, REPLICATION_FACTOR_MAX,
                 high_name="REPLICATION_FACTOR_MAX", error=errors.InvalidReplicationFactorError)
        config: dict[str, Any] = {
            "queue": True, "retention_ms": -1, "visibility_timeout_ms": visibility_timeout_ms,
            "max_deliveries": max_deliveries, "message_ttl_ms": message_ttl_ms, "max_messages": max_messages,
            "max_bytes": max_bytes, "message_bytes_max": max_message_bytes, "dedup_window_ms": dedup_window_ms,
            "queue_group_retention_ms": group_retention_ms}
        for key, value in config.items():
            if key != "queue":  # only the type: the bounds are the node's, checked just below
                int_arg(key, value, -I64_MAX - 1, I64_MAX)
        if dead_letter:
            config["dead_letter"] = dead_letter
        # The node's own rules (fabric/zk.py), applied before anything is created: a queue
        # refused after its dead-letter queue was made would leave that queue behind.
        from fabric import zk as zkl  # brings kazoo: loaded only when used

        if apis.is_internal_topic(name):
            raise errors.InvalidTopicError(f"topic {name!r}: names starting with {apis.INTERNAL_TOPIC_PREFIX!r} "
                                           "are Fabric's internal topics")
        zkl.validate_topic_name(name)
        zkl.TopicConfig.build(partitions, replication_factor,
                              {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in config.items()}, 0)
        if dead_letter:
            if dead_letter == name:
                raise errors.InvalidQueueConfigError("a queue cannot be its own dead-letter queue")
            try:
                # A dead letter is its message plus the fabric.dlq.* headers: with the queue's
                # own limit, a message near it could never be dead-lettered.
                dead_letter_bytes = min(max_message_bytes + qp.DEAD_LETTER_ROOM_BYTES, TOPIC_MESSAGE_BYTES_MAX)
                self.create_queue(dead_letter, partitions, replication_factor, max_message_bytes=dead_letter_bytes,
                                  wait=wait)
            except errors.TopicAlreadyExistsError:
                pass
        self.create_topic(name, partitions, replication_factor, config, wait=wait)

    def delete_queue(self, name: str) -> None:
        self._queue_settings(str_arg("name", name))  # refuses a topic that is not a queue
        self.delete_topic(name)

    def list_queues(self) -> list[str]:
        return sorted(t.name for t in self.describe_topics() if t.configs.get("queue") == "true")

    def _queue_settings(self, name: str) -> dict[str, str]:
        configs = self.describe_topics([name])[0].configs
        if configs.get("queue") != "true":
            raise errors.InvalidRequestError(f"topic {name!r} is not a queue (it may still be consumed in queue mode)")
        return {k: configs[k] for k in QUEUE_SETTINGS if k in configs}

    def describe_queue(self, name: str, group: str = qp.DEFAULT_GROUP, *, timeout_s: float = 10.0) -> QueueDescription:
        """Counts per partition for ``group``: visible, in flight, delayed, dead-lettered,
        dropped, deduplicated, and the age of the oldest message waiting. Works for any
        topic (consumed in queue mode); a topic made as a queue also shows its settings."""
        if not str_arg("group", group):
            # "" asks the nodes for every group at once: the totals would add groups up.
            raise errors.InvalidRequestError("describe_queue needs a group; describe_queue_groups(name) has them all")
        configs = self.describe_topics([str_arg("name", name)])[0].configs
        settings = {k: configs[k] for k in QUEUE_SETTINGS if k in configs}
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return QueueDescription(name, group, settings, tuple(self._queue_counts(name, group)))
            except errors.RetriableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(DESCRIBE_RETRY_S)
                self._meta.refresh([name])

    def describe_queue_groups(self, name: str, *, timeout_s: float = 10.0) -> dict[str, QueueDescription]:
        """Every group consuming ``name`` (as ``describe_queue`` describes one), by group; a
        queue nobody consumes yet has one entry, group ""."""
        configs = self.describe_topics([str_arg("name", name)])[0].configs
        settings = {k: configs[k] for k in QUEUE_SETTINGS if k in configs}
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                rows = self._queue_counts(name, "")
                break
            except errors.RetriableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(DESCRIBE_RETRY_S)
                self._meta.refresh([name])
        groups: dict[str, list[QueuePartitionCounts]] = {}
        for row in rows:
            groups.setdefault(row.group, []).append(row)
        unread = {r.partition: r for r in groups.pop("", [])}  # partitions no group has read yet
        if not groups and unread:
            groups[""] = list(unread.values())
        all_partitions = {r.partition for r in rows}
        for group, partition_rows in groups.items():
            # A group that has not touched a partition yet has everything there waiting,
            # which is what the partition's "" row counts.
            have = {r.partition for r in partition_rows}
            partition_rows.extend(dataclasses.replace(r, group=group) for p, r in unread.items() if p not in have)
            if {r.partition for r in partition_rows} != all_partitions:
                # Another group has read a partition this one has not: ask for this group's view.
                groups[group] = [r for r in self._queue_counts(name, group) if r.group == group]
        return {g: QueueDescription(name, g, settings, tuple(sorted(rs, key=lambda r: r.partition)))
                for g, rs in sorted(groups.items())}

    def delete_queue_group(self, name: str, group: str, *, timeout_s: float = 10.0) -> list[int]:
        """Delete ``group``'s state on every partition of queue ``name`` (any topic read in
        queue mode): it no longer counts toward QUEUE_GROUPS_MAX nor holds back the queue's
        deletion, durably (a new leader does not bring it back). Returns the partitions it
        was deleted on. Raises GroupNotEmptyError while it holds live leases or a receive
        waits (on those partitions' node nothing is deleted; retry once its workers stop),
        GroupIdNotFoundError when no partition has it. Retries a leader that is loading or
        moving for up to ``timeout_s``."""
        str_arg("name", name)
        if not str_arg("group", group):
            raise errors.InvalidRequestError("delete_queue_group needs a group name")
        # Kept across retries: a partition deleted by a first try answers GROUP_ID_NOT_FOUND
        # to the next, after a leader elsewhere moved.
        answers: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._queue_leaders_call(name, ApiKey.QUEUE_DELETE_GROUP, {"queue": name, "group": group}, answers)
                break
            except errors.RetriableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(DESCRIBE_RETRY_S)
        deleted = {p["partition"] for p in answers if not p["error"]}
        if not deleted:
            raise errors.GroupIdNotFoundError(f"queue {name!r} has no group {group!r}")
        return sorted(deleted)

    def purge_queue(self, name: str, group: str | None = None, *, timeout_s: float = 10.0) -> dict[str, int]:
        """Settle every message of queue ``name`` (any topic read in queue mode) sent before
        the call, as SQS's PurgeQueue: for every group, those to come included (``group``
        None), or for ``group`` alone. Each is settled as an ack settles it: not
        dead-lettered, not delivered again; delayed messages too; held leases are dropped
        (their ack succeeds, a nack or extend raises LeaseNotHeldError listing them in
        ``settled``). Durable before it returns; idempotent (run again, it purges only what
        was sent since). Returns the messages purged by group (summed over partitions; ""
        is a queue nobody consumes yet). Retries a leader that is loading or moving for up
        to ``timeout_s``."""
        str_arg("name", name)
        group = optional_str_arg("group", group)
        if group is not None and not group:
            raise errors.InvalidRequestError("purge_queue: group is None (every group) or a group name, not ''")
        # Kept across retries: each try counts only what it purged (a partition purged by an
        # earlier try answers 0 for it), so the sum is what the call purged.
        answers: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._queue_leaders_call(name, ApiKey.QUEUE_PURGE, {"queue": name, "group": group or ""}, answers)
                break
            except errors.RetriableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(DESCRIBE_RETRY_S)
        purged: dict[str, int] = {}
        for row in answers:
            purged[row["group"]] = purged.get(row["group"], 0) + row["purged"]
        if len(purged) > 1 and not purged.get("", 1):
            del purged[""]  # the floor of groups to come, beside groups that counted themselves
        return dict(sorted(purged.items()))

    def _queue_leaders_call(self, name: str, api_key: int, body: dict[str, Any], out: list[dict[str, Any]]) -> None:
        """``api_key`` to each leader of ``name``'s partitions, their ``partitions`` answers
        added to ``out`` as they come; NotLeaderError (retriable) unless every partition was
        answered for."""
        meta = self._meta.refresh([name])
        topic = self._meta.topic(name)
        addresses = {meta.leader_address(name, p.partition) for p in topic.partitions}
        if None in addresses:
            raise errors.LeaderNotAvailableError(f"a partition of {name!r} has no leader")
        answered: set[int] = set()
        for address in sorted(a for a in addresses if a):
            answer = self._conns.request(address, api_key, body, timeout_ms=self.request_timeout_ms).body
            errors.raise_for_code(answer["error"], answer["message"])
            out.extend(answer["partitions"])
            answered.update(p["partition"] for p in answer["partitions"])
        if answered != set(range(topic.partition_count)):
            raise errors.NotLeaderError(f"leadership of {name!r} moved while asking its leaders")

    def _queue_counts(self, name: str, group: str) -> list[QueuePartitionCounts]:
        meta = self._meta.refresh([name])
        topic = self._meta.topic(name)
        addresses = {meta.leader_address(name, p.partition) for p in topic.partitions}
        if None in addresses:
            raise errors.LeaderNotAvailableError(f"a partition of {name!r} has no leader")
        out: list[QueuePartitionCounts] = []
        for address in sorted(a for a in addresses if a):
            body = self._conns.request(address, ApiKey.QUEUE_DESCRIBE, {"queue": name, "group": group},
                                       timeout_ms=self.request_timeout_ms).body
            errors.raise_for_code(body["error"], body["message"])
            out.extend(QueuePartitionCounts(
                p["partition"], p["group"], p["visible"], p["in_flight"], p["delayed"], p["dead_lettered"],
                p["dropped"], p["deduplicated"], p["oldest_age_ms"]) for p in body["partitions"])
        if {c.partition for c in out} != set(range(topic.partition_count)):
            raise errors.NotLeaderError(f"leadership of {name!r} moved while describing it")
        return sorted(out, key=lambda c: (c.partition, c.group))

    def redrive(self, name: str, *, dead_letter: str | None = None, max_messages: int = 0) -> int:
        """Move dead letters back to ``name`` (from its dead-letter queue, or ``dead_letter``):
        each is sent again (acks=all) without its ``fabric.dlq.*`` headers, then removed from
        the dead-letter queue. At-least-once: a crash in between leaves a copy in both.
        Moves what was waiting when it started (at most ``max_messages``, 0: no limit), so a
        message that fails again is not moved twice by one call; returns how many moved."""
        from sdk.producer import Producer  # the upper layers of the SDK, loaded when used
        from sdk.queue import QueueConsumer

        str_arg("name", name)
        dead_letter = optional_str_arg("dead_letter", dead_letter)
        int_arg("max_messages", max_messages, 0, I64_MAX)
        source = dead_letter or self._queue_settings(name).get("dead_letter", "")
        if not source:
            raise errors.InvalidRequestError(f"queue {name!r} has no dead-letter queue; name one with dead_letter=")
        # What is waiting now, and no more: a message that fails again after the move comes
        # back to the dead-letter queue, and must not be moved again by this same call.
        waiting = self.describe_queue(source, REDRIVE_GROUP)
        limit = waiting.total("visible") + waiting.total("delayed")
        if max_messages:
            limit = min(limit, max_messages)
        bootstrap = ",".join(self._meta.candidates())
        moved = 0
        security = self._conns.security  # the Admin's keys on a secure cluster, not only the environment's
        consumer = QueueConsumer(bootstrap, source, REDRIVE_GROUP, security=security)
        producer = Producer(bootstrap, acks="all", security=security)
        try:
            while moved < limit:
                batch = consumer.receive(min(qp.RECEIVE_MESSAGES_MAX, limit - moved), REDRIVE_IDLE_MS)
                if not batch:
                    break
                futures = [producer.send(name, m.value, key=m.key,
                                         headers=[(k, v) for k, v in m.headers if k not in qp.DLQ_HEADERS])
                           for m in batch]
                producer.flush()
                for future in futures:
                    future.result(timeout=30)
                consumer.ack(batch)
                moved += len(batch)
        finally:
            producer.close()
            consumer.close()
        return moved

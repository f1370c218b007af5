"""Consumer-group administration, mixed into ``sdk.Admin``: list, describe (with lag),
reset offsets, delete. The coordinator refuses resets and deletes while members are live."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fabric import errors
from fabric.limits import PARTITIONS_MAX
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol import groups as gp
from fabric.protocol.apis import ApiKey
from fabric.wording import plural
from sdk._arguments import I32_MAX, I64_MAX, int_arg, str_arg
from sdk._client import METADATA_CONNECT_MS, METADATA_TIMEOUT_MS, TopicPartition
from sdk._group import MEMBER_ID_BYTES_MAX

if TYPE_CHECKING:
    from sdk._client import Connections, MetadataClient

GROUP_ADMIN_RETRY_S: Final[float] = 0.1
RESET_TARGETS: Final[tuple[str, ...]] = ("earliest", "latest", "datetime", "offset")


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    state: str  # empty, stable or reconciling
    members: int


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    instance_id: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    subscribed_pattern: str
    assignment: tuple[TopicPartition, ...]
    revoking: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class PartitionOffset:
    topic: str
    partition: int
    # None when the group has committed nothing for this partition (a member holds it but
    # has not committed yet): kafka-consumer-groups prints "-" there, not an offset.
    committed: int | None
    log_end: int  # -1 when the partition has no leader to ask (or the topic is gone)
    # log_end - committed; None when either is unknown. It used to be the whole log end
    # for a partition with no commit, which read as a backlog the group may not have.
    lag: int | None
    metadata: str
    member_id: str  # who reads it now ("" if nobody)


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    group_epoch: int
    members: tuple[MemberDescription, ...]
    offsets: tuple[PartitionOffset, ...]


def partition_lag(committed: int | None, log_end: int) -> int | None:
    """How far the group is behind on one partition: None unless both offsets are known.
    With no commit the lag is undefined (the group starts at its ``auto_offset_reset``,
    maybe the log end), so it is not reported as the whole log, as Kafka's tools do."""
    if committed is None or log_end < 0:
        return None
    return max(0, log_end - committed)


def _tps(entries: list[dict[str, Any]]) -> tuple[TopicPartition, ...]:
    return tuple(sorted((TopicPartition(t, p) for t, p in gp.tp_set(entries)), key=lambda tp: (tp.topic, tp.partition)))


class GroupAdmin:
    _conns: Connections
    _meta: MetadataClient
    request_timeout_ms: int

    def list_groups(self) -> list[GroupListing]:
        """Every group any node coordinates (each node answers for its own)."""
        found: dict[str, GroupListing] = {}
        for address in self._meta.refresh().nodes.values():
            try:
                # A read: a node that does not answer (paused, cut off) costs a metadata
                # request's timeout, not request_timeout_ms (as describe_topics).
                body = self._conns.request(address, ApiKey.LIST_GROUPS, {}, timeout_ms=self._read_timeout_ms()).body
            except errors.RetriableError:
                continue
            for g in body["groups"]:
                found[g["group_id"]] = GroupListing(g["group_id"], g["state"], g["members"])
        return [found[k] for k in sorted(found)]

    def describe_group(self, group_id: str) -> GroupDescription:
        """Members, assignment, and per partition the committed offset, log end and lag."""
        body = self._group_call(group_id, ApiKey.DESCRIBE_GROUPS, {"group_ids": [group_id]})
        g = _row_of(body["groups"], group_id, "DESCRIBE_GROUPS")
        errors.raise_for_code(g["error"], f"describe group {group_id!r}")
        fault = _description_fault(g)
        if fault:
            raise errors.UnknownServerError(f"the DESCRIBE_GROUPS answer for group {group_id!r} gave {fault}",
                                            group_id=group_id)
        members = tuple(MemberDescription(m["member_id"], m["instance_id"], m["member_epoch"],
                                          tuple(m["subscribed_topics"]), m["subscribed_topic_regex"],
                                          _tps(m["assignment"]), _tps(m["revoking"])) for m in g["members"])
        reader = {tp: m.member_id for m in members for tp in m.assignment}
        fetched = self._group_call(group_id, ApiKey.OFFSET_FETCH, {"group_id": group_id, "partitions": []})
        errors.raise_for_code(fetched["error"], fetched["message"])
        for o in fetched["offsets"]:
            if not -1 <= o["offset"] <= batch_format.OFFSET_MAX:  # was taken for "none"
                raise errors.UnknownServerError(
                    f"the OFFSET_FETCH answer for group {group_id!r} gave {o['topic'][:200]!r} partition "
                    f"{o['partition']} offset {o['offset']} (-1, for none, or 0 up)", group_id=group_id)
        committed = {TopicPartition(o["topic"], o["partition"]): (o["offset"], o["metadata"])
                     for o in fetched["offsets"] if o["offset"] >= 0}  # -1 is the wire's "none"
        tps = sorted(set(committed) | set(reader), key=lambda tp: (tp.topic, tp.partition))
        ends = self._list_offsets(tps, apis.LATEST_TIMESTAMP)
        offsets = []
        for tp in tps:
            offset, metadata = committed.get(tp, (None, ""))
            end = ends.get(tp, -1)
            offsets.append(PartitionOffset(tp.topic, tp.partition, offset, end, partition_lag(offset, end), metadata,
                                           reader.get(tp, "")))
        return GroupDescription(g["group_id"], g["state"], g["group_epoch"], members, tuple(offsets))

    def reset_offsets(self, group_id: str, topic: str, *, to: str, offset: int | None = None,
                      timestamp_ms: int | None = None, partitions: list[int] | None = None,
                      dry_run: bool = False) -> dict[TopicPartition, int]:
        """Set the group's committed offsets of ``topic`` to ``earliest``, ``latest``, the first
        record at or after ``timestamp_ms`` (``datetime``) or ``offset``. Refused with
        GroupNotEmptyError while the group has live members. Returns what was committed;
        with ``dry_run=True`` what would be, committing nothing (still GroupNotEmptyError
        while the group has members, as kafka-consumer-groups' dry run)."""
        gp.check_group_id(str_arg("group_id", group_id))
        str_arg("topic", topic)
        if to not in RESET_TARGETS:
            raise ValueError(f"to must be one of {', '.join(RESET_TARGETS)}, got {to!r}")
        if to == "offset":
            if offset is None:
                raise ValueError("to='offset' needs offset >= 0")
            int_arg("offset", offset, 0, I64_MAX)
        if to == "datetime":
            if timestamp_ms is None:
                raise ValueError("to='datetime' needs timestamp_ms")
            int_arg("timestamp_ms", timestamp_ms, 0, I64_MAX)  # negative ones are LIST_OFFSETS' codes
        if partitions is not None:
            if isinstance(partitions, (str, bytes)) or not isinstance(partitions, (list, tuple, range)):
                raise TypeError(f"partitions must be a list of partition numbers, got {type(partitions).__name__}")
            for p in partitions:
                int_arg("each of partitions", p, 0, I32_MAX)
        meta = self._meta.refresh([topic]).topics.get(topic)
        if meta is None:
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        missing = sorted(set(partitions or ()) - set(range(meta.partition_count)))
        if missing:  # else their offsets would read as -1 and be committed as such
            raise errors.UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {missing[0]}")
        tps = [TopicPartition(topic, p) for p in (partitions if partitions is not None else range(meta.partition_count))]
        earliest = self._list_offsets(tps, apis.EARLIEST_TIMESTAMP)
        latest = self._list_offsets(tps, apis.LATEST_TIMESTAMP)
        if to == "earliest":
            wanted = earliest
        elif to == "latest":
            wanted = latest
        elif to == "datetime":
            assert timestamp_ms is not None  # checked above
            found = self._list_offsets(tps, timestamp_ms)
            wanted = {tp: found[tp] if found[tp] >= 0 else latest[tp] for tp in tps}
        else:
            assert offset is not None  # checked above
            wanted = {tp: min(max(offset, earliest[tp]), latest[tp]) for tp in tps}
        if dry_run:
            live = self.describe_group(group_id).members
            if live:
                raise errors.GroupNotEmptyError(
                    f"group {group_id!r} has {plural(len(live), 'live member')}: a reset would be refused "
                    "(stop its consumers first)")
            return dict(wanted)
        body = {"group_id": group_id, "member_id": "", "member_epoch": -1,
                "offsets": [{"topic": tp.topic, "partition": tp.partition, "offset": off, "metadata": ""}
                            for tp, off in wanted.items()]}
        response = self._group_call(group_id, ApiKey.OFFSET_COMMIT, body)
        errors.raise_for_code(response["error"], response["message"])
        for r in response["results"]:
            if r["error"] == errors.GroupNotEmptyError.code:  # the coordinator refuses a reset under live members
                raise errors.GroupNotEmptyError(f"group {group_id!r} has live members: a reset is refused while any "
                                                "member is live (stop its consumers first)")
            errors.raise_for_code(r["error"], f"group {group_id!r}: reset of {r['topic']}/{r['partition']} refused")
        return dict(wanted)

    def delete_group(self, group_id: str) -> None:
        """Delete the group and its committed offsets (refused while members are live)."""
        body = self._group_call(group_id, ApiKey.DELETE_GROUPS, {"group_ids": [group_id]})
        result = _row_of(body["results"], group_id, "DELETE_GROUPS")
        errors.raise_for_code(result["error"], result["message"] or f"delete group {group_id!r}")

    # -- plumbing ---------------------------------------------------------------------------
    def _read_timeout_ms(self) -> int:
        return min(self.request_timeout_ms, METADATA_TIMEOUT_MS)

    def _group_call(self, group_id: str, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
        """One request to the group's coordinator, within ``request_timeout_ms`` in all:
        finding the coordinator, each try and the pauses between. (Each try used to wait
        the whole timeout on every node asked for the coordinator: a describe_group with
        every node paused took 60 s at the default 30 s.)"""
        gp.check_group_id(str_arg("group_id", group_id))
        deadline = time.monotonic() + self.request_timeout_ms / 1000.0
        while True:
            try:
                address = self._find_coordinator(group_id, deadline)
                left_ms = _left_ms(self.request_timeout_ms, deadline)
                reply = self._conns.request(address, api_key, body, timeout_ms=left_ms,
                                            wait_connect_ms=min(left_ms, METADATA_CONNECT_MS)).body
                code = reply.get("error", 0)
                if not code and api_key == ApiKey.DESCRIBE_GROUPS:
                    code = _row_of(reply["groups"], group_id, "DESCRIBE_GROUPS")["error"]
                if not code and api_key == ApiKey.DELETE_GROUPS:
                    code = _row_of(reply["results"], group_id, "DELETE_GROUPS")["error"]
                if code and errors.error_for_code(code).retriable:
                    raise errors.error_for_code(code)(reply.get("message", ""))
                return reply
            except errors.RetriableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(GROUP_ADMIN_RETRY_S, max(0.0, deadline - time.monotonic())))

    def _find_coordinator(self, group_id: str, deadline: float | None = None) -> str:
        """Any node answers FIND_COORDINATOR alike, so each gets a read's timeout: a paused
        node then costs 5 s before the next is asked, not the whole request timeout. All
        by ``deadline`` (``time.monotonic()``; request_timeout_ms from now by default)."""
        if deadline is None:
            deadline = time.monotonic() + self.request_timeout_ms / 1000.0
        last: Exception | None = None
        for address in self._meta.candidates(deadline_s=deadline):
            try:
                left_ms = _left_ms(self._read_timeout_ms(), deadline)
                body = self._conns.request(address, ApiKey.FIND_COORDINATOR, {"group_id": group_id},
                                           timeout_ms=left_ms, wait_connect_ms=min(left_ms, METADATA_CONNECT_MS)).body
            except errors.RetriableError as exc:
                last = exc
                continue
            errors.raise_for_code(body["error"], body["message"])
            return str(body["address"])
        raise errors.CoordinatorNotAvailableError(f"no node answered FIND_COORDINATOR: {last}")

    def _list_offsets(self, tps: list[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
        """One LIST_OFFSETS per leader, each with a read's timeout (one per partition, each
        with the whole request timeout, made a paused leader cost describe_group 30 s per
        partition it leads). -1 for a partition without a leader or whose leader refused."""
        out: dict[TopicPartition, int] = {}
        if not tps:
            return out
        metadata = self._meta.refresh(sorted({tp.topic for tp in tps}))
        by_leader: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            address = metadata.leader_address(tp.topic, tp.partition)
            if address is None:
                out[tp] = -1
            else:
                by_leader.setdefault(address, []).append(tp)
        for address, led in by_leader.items():
            body = self._conns.request(address, ApiKey.LIST_OFFSETS, {"partitions": [
                {"topic": tp.topic, "partition": tp.partition, "timestamp": timestamp} for tp in led]},
                timeout_ms=self._read_timeout_ms()).body
            # By name, not by position: an answer with fewer or more rows than asked raised
            # a bare ValueError from zip. A partition left out is one the leader refused.
            results = {(r["topic"], r["partition"]): r for r in body["partitions"]}
            for tp in led:
                result = results.get((tp.topic, tp.partition))
                if result is None or result["error"]:
                    out[tp] = -1
                    continue
                # -1 means "none" only for a time (as in Consumer's offset lookups): a
                # negative log start or end was shown by describe_group (and its lag taken
                # for unknown) and given back by reset_offsets.
                if not (-1 if timestamp >= 0 else 0) <= result["offset"] <= batch_format.OFFSET_MAX:
                    raise errors.UnknownServerError(
                        f"the LIST_OFFSETS answer of {address} gave {tp} offset {result['offset']}")
                out[tp] = result["offset"]
        return out


def _description_fault(row: dict[str, Any]) -> str:
    """What makes a DESCRIBE_GROUPS row with no error one that no coordinator sends ("" when
    nothing does; nodes/group_state.py ``describe``), so that describe_group never hands
    the user an impossible value: a group epoch below 0; a member id that is empty, not a
    string, longer than MEMBER_ID_BYTES_MAX or given twice; an instance id that is not a
    string; a member epoch below 1 (a coordinator gives 1 or more); a partition outside 0
    to PARTITIONS_MAX-1; a partition held (assigned or being revoked) twice, by one member
    or by two (the coordinator gives a partition only to a member when no other holds it).
    ``state`` is not checked: a newer node may name a state this SDK does not know."""
    if row["group_epoch"] < 0:
        return f"group epoch {row['group_epoch']} (a coordinator gives 0 or more)"
    seen_ids: set[str] = set()
    held: set[tuple[str, int]] = set()
    for member in row["members"]:
        member_id = member["member_id"]
        if not isinstance(member_id, str) or not member_id or len(member_id.encode("utf-8")) > MEMBER_ID_BYTES_MAX:
            return (f"member id {str(member_id)[:40]!r} of type {type(member_id).__name__} (a coordinator gives "
                    f"1 to MEMBER_ID_BYTES_MAX={MEMBER_ID_BYTES_MAX} bytes)")
        if member_id in seen_ids:
            return f"member {member_id[:40]!r} twice"
        seen_ids.add(member_id)
        if not isinstance(member["instance_id"], str):
            return f"member {member_id[:40]!r} an instance id of type {type(member['instance_id']).__name__}"
        if member["member_epoch"] < 1:
            return f"member {member_id[:40]!r} epoch {member['member_epoch']} (a coordinator gives 1 or more)"
        for entry in (*member["assignment"], *member["revoking"]):
            for partition in entry["partitions"]:
                if not 0 <= partition < PARTITIONS_MAX:
                    return (f"member {member_id[:40]!r} partition {partition} of {entry['topic'][:200]!r} (partitions "
                            f"are 0 to PARTITIONS_MAX-1={PARTITIONS_MAX - 1})")
                if (entry["topic"], partition) in held:
                    return f"partition {partition} of {entry['topic'][:200]!r} held twice"
                held.add((entry["topic"], partition))
    return ""


def _row_of(rows: list[dict[str, Any]], group_id: str, api: str) -> dict[str, Any]:
    """The row of a DESCRIBE_GROUPS or DELETE_GROUPS answer about ``group_id``, matched by
    id: taking the first row raised a bare IndexError for an answer without rows (a buggy
    or version-skewed node), and reported another group's state for one about another."""
    for row in rows:
        if row["group_id"] == group_id:
            return row
    raise errors.UnknownServerError(f"the {api} answer left out group {group_id!r}")


def _left_ms(timeout_ms: int, deadline: float) -> int:
    """``timeout_ms`` cut to what is left until ``deadline`` (``time.monotonic()``);
    RequestTimedOutError (retriable) when nothing is."""
    left_ms = math.ceil((deadline - time.monotonic()) * 1000)
    if left_ms <= 0:
        raise errors.RequestTimedOutError("the group call ran out of its time (request_timeout_ms)")
    return min(timeout_ms, left_ms)

"""One consumer group's state on its coordinator, and the one place that decides it.

Pure: no sockets, no storage, the clock passed in (``now_ms``). The coordinator
(``nodes/group_coordinator.py``) feeds it requests, persists what it says changed, and only
then answers.

The safety rule (KIP-848's): **a partition is given to a member only when no other member
holds it**, where a member holds what it was told it owns (``assignment``) plus what it was
told to give up but has not yet confirmed (``revoking``). A member confirms a revocation by
leaving the partition out of ``owned`` in a later heartbeat, which it does only after its
``on_partitions_revoked`` callback (and commit) finished. So no partition is ever held by
two members, and members whose partitions do not move never stop reading.

Member epochs fence zombies: every change of a member's assignment bumps its epoch; a
heartbeat or commit with an older epoch is refused (the previous epoch is still accepted
when the member holds nothing it was not given, which covers a lost response).

Instance ids fence replaced static members (KIP-345's rule): a join with an instance id
and no member id is a process (re)starting, and always takes the instance over; from then
on every request of the member it replaced (heartbeat, rejoin under its old member id,
leave, commit) is answered FENCED_INSTANCE_ID, which the SDK treats as fatal. So two live
processes with one instance id cannot take the partitions from each other for ever: the
older one stops.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from fabric import errors
from fabric.protocol import groups as gp
from nodes.group_assignor import TopicPartition, assign

SESSION_TIMEOUT_MS_DEFAULT: Final[int] = 45_000  # Kafka's default
SESSION_TIMEOUT_MS_MIN: Final[int] = 6_000  # Kafka's group.min.session.timeout.ms
SESSION_TIMEOUT_MS_MAX: Final[int] = 1_800_000  # 30 min, Kafka's group.max.session.timeout.ms
HEARTBEAT_INTERVAL_MS_DEFAULT: Final[int] = 3_000  # Kafka's default
# A member waiting for partitions that another member is still revoking, or that was just
# told to revoke, is asked back this soon: that is what makes a rebalance take
# milliseconds rather than heartbeat intervals.
HEARTBEAT_INTERVAL_MS_RECONCILING: Final[int] = 100
GROUP_MEMBERS_MAX: Final[int] = 1_000
# Member ids replaced by a static join that a commit is still answered FENCED_INSTANCE_ID
# for (a commit carries no instance id). Kept in memory only: after a coordinator reload
# such a commit gets UNKNOWN_MEMBER_ID, refused all the same, and the member's next
# heartbeat, which does carry its instance id, still gets FENCED_INSTANCE_ID.
REPLACED_MEMBER_IDS_MAX: Final[int] = GROUP_MEMBERS_MAX
# (principal, topic) -> may that principal describe that topic (secure clusters only)
MayDescribe = Callable[[str, str], bool]

EMPTY = "empty"
STABLE = "stable"
RECONCILING = "reconciling"


@dataclass
class Member:
    member_id: str
    instance_id: str
    member_epoch: int
    session_timeout_ms: int
    subscribed_topics: list[str]
    subscribed_topic_regex: str
    assignment: set[TopicPartition] = field(default_factory=set)
    revoking: set[TopicPartition] = field(default_factory=set)
    deadline_ms: int = 0  # session expiry; not persisted (a new coordinator restarts the clock)
    previous_epoch: int = -1
    left_static: bool = False
    # Who the member authenticated as on a secure cluster ("" otherwise): its pattern
    # matches only topics that principal may describe (docs/SECURITY.md).
    principal: str = ""

    def holds(self) -> set[TopicPartition]:
        return self.assignment | self.revoking

    def to_record(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id, "instance_id": self.instance_id, "member_epoch": self.member_epoch,
            "previous_epoch": self.previous_epoch, "session_timeout_ms": self.session_timeout_ms, "subscribed_topics": list(self.subscribed_topics),
            "subscribed_topic_regex": self.subscribed_topic_regex,
            "assignment": gp.tp_list(self.assignment), "revoking": gp.tp_list(self.revoking),
            "principal": self.principal,
        }

    @classmethod
    def from_record(cls, value: dict[str, Any], now_ms: int) -> Member:
        return cls(value["member_id"], value["instance_id"], value["member_epoch"], value["session_timeout_ms"],
                   list(value["subscribed_topics"]), value["subscribed_topic_regex"],
                   gp.tp_set(value["assignment"]), gp.tp_set(value["revoking"]),
                   deadline_ms=now_ms + value["session_timeout_ms"], previous_epoch=value["previous_epoch"],
                   principal=value.get("principal", ""))


@dataclass
class HeartbeatResult:
    response: dict[str, Any]
    changed: bool  # the persisted state changed: write it before answering


def _error_response(exc: errors.FabricError, member_id: str = "", epoch: int = -1) -> dict[str, Any]:
    return {"error": exc.code, "message": exc.message, "member_id": member_id, "member_epoch": epoch,
            "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS_DEFAULT, "assignment": []}


def _epoch_refused(epoch: int, member: Member) -> str:
    """FENCED_MEMBER_EPOCH's message. An epoch above the current one was never given to the
    member (answers wait for their records to commit), so calling it "stale", as this did,
    sent readers looking for a lost answer; only one below the current epoch is stale."""
    if epoch > member.member_epoch:
        why = f"member epoch {epoch} is unknown: ahead of the current epoch {member.member_epoch}"
    elif epoch == member.previous_epoch:
        why = (f"member epoch {epoch} is stale (current {member.member_epoch}); the previous epoch is taken only "
               "while owned lists nothing the member was not given")
    else:
        why = f"member epoch {epoch} is stale (current {member.member_epoch})"
    return f"{why}; rejoin with member epoch 0 and this member id"


class GroupState:
    def __init__(self, group_id: str, *, new_member_id: Callable[[], str] | None = None) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.members: dict[str, Member] = {}
        # (topic, partition) -> (offset, metadata, commit_ms)
        self.offsets: dict[TopicPartition, tuple[int, str, int]] = {}
        self._new_member_id = new_member_id or (lambda: uuid.uuid4().hex)
        # When the group last had a member (wall-clock ms; the coordinator stamps it, and a
        # reload takes it from the group record's timestamp): with its commits, what offsets
        # retention counts from (nodes/group_retention.py).
        self.active_ms = 0
        # member id -> the instance id a later static join took from it (oldest first)
        self._replaced: dict[str, str] = {}
        self._target: dict[str, set[TopicPartition]] = {}
        # A member left or expired since the target was computed: its partitions are not in
        # anyone's target until the next heartbeat recomputes it, so the group is not stable.
        self._target_stale = False

    # -- persistence --------------------------------------------------------------------
    def to_record(self) -> bytes:
        return gp.encode_group_value(self.group_epoch, [m.to_record() for m in self.members.values()])

    def load_record(self, value: dict[str, Any] | None, now_ms: int) -> None:
        if value is None:
            self.group_epoch = 0
            self.members = {}
            return
        self.group_epoch = value["group_epoch"]
        self.members = {m["member_id"]: Member.from_record(m, now_ms) for m in value["members"]}

    # -- queries ------------------------------------------------------------------------
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self._target_stale or any(m.revoking or m.assignment != self._target.get(m.member_id, m.assignment)
                                     for m in self.members.values()):
            return RECONCILING
        return STABLE

    def is_empty(self) -> bool:
        return not self.members

    def fetch_offsets(self, wanted: list[TopicPartition], principal: str = "",
                      may_describe: MayDescribe | None = None,
                      created_ms: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """OFFSET_FETCH's answer: ``wanted``, or when empty every committed partition of the
        topics ``principal`` may describe (a named topic was already checked by the ACL).

        A commit older than its topic's ``created_ms`` (per topic, when given) was made
        on a deleted topic of the same name: it is forgotten, as Kafka drops a deleted
        topic's offsets, or the group would resume the new topic at the old offset and
        skip its first records."""
        for tp in [tp for tp, entry in self.offsets.items() if entry[2] < (created_ms or {}).get(tp[0], -1)]:
            del self.offsets[tp]
        if not wanted:
            wanted = sorted(tp for tp in self.offsets if may_describe is None or may_describe(principal, tp[0]))
        return [{"topic": tp[0], "partition": tp[1], "offset": offset, "metadata": metadata, "commit_ms": commit_ms}
                for tp in wanted for offset, metadata, commit_ms in [self.offsets.get(tp, (-1, "", -1))]]

    @staticmethod
    def not_described(group_id: str, code: int) -> dict[str, Any]:
        """DESCRIBE_GROUPS' entry for a group this coordinator cannot describe."""
        return {"error": code, "group_id": group_id, "state": "", "group_epoch": -1, "members": []}

    def describe(self) -> dict[str, Any]:
        return {
            "error": 0, "group_id": self.group_id, "state": self.state(), "group_epoch": self.group_epoch,
            "members": [{
                "member_id": m.member_id, "instance_id": m.instance_id, "member_epoch": m.member_epoch,
                "subscribed_topics": list(m.subscribed_topics), "subscribed_topic_regex": m.subscribed_topic_regex,
                "assignment": gp.tp_list(m.assignment), "revoking": gp.tp_list(m.revoking),
            } for m in sorted(self.members.values(), key=lambda m: m.member_id)],
        }

    # -- the state machine ----------------------------------------------------------------
    def heartbeat(self, request: dict[str, Any], now_ms: int, topic_partitions: dict[str, int], *,
                  principal: str = "", may_describe: MayDescribe | None = None) -> HeartbeatResult:
        """One CONSUMER_GROUP_HEARTBEAT. ``topic_partitions``: the cluster's topics now.
        On a secure cluster ``principal`` is who sent it and ``may_describe`` the ACL check:
        a pattern then matches only topics the member's principal may describe (KIP-848's
        rule), so it neither learns other topics' names nor is given partitions it could
        not read while members that could read them go without."""
        try:
            return self._heartbeat(request, now_ms, topic_partitions, principal, may_describe)
        except errors.FabricError as exc:
            return HeartbeatResult(_error_response(exc, request["member_id"]), False)

    def _heartbeat(self, req: dict[str, Any], now_ms: int, topic_partitions: dict[str, int], principal: str,
                   may_describe: MayDescribe | None) -> HeartbeatResult:
        epoch = req["member_epoch"]
        member_id = req["member_id"]
        # Before anything changes: a replaced member may neither leave for the member that
        # replaced it (marking it left) nor rejoin under its old id and take the instance back.
        # An empty member id is a new process, which always wins (_join).
        if member_id:
            self._check_instance(member_id, req["instance_id"])
        if epoch == gp.LEAVE_EPOCH or epoch == gp.STATIC_LEAVE_EPOCH:
            return self._leave(member_id, epoch)
        timeout_ms = req["session_timeout_ms"]
        if not SESSION_TIMEOUT_MS_MIN <= timeout_ms <= SESSION_TIMEOUT_MS_MAX:
            raise errors.InvalidRequestError(
                f"session_timeout_ms={timeout_ms} outside [{SESSION_TIMEOUT_MS_MIN}, {SESSION_TIMEOUT_MS_MAX}]")
        regex = req["subscribed_topic_regex"]
        if regex:
            gp.compile_topic_pattern(regex)  # refuses a bad or oversized pattern
        if not req["subscribed_topics"] and not regex:
            raise errors.InvalidRequestError("a member must subscribe to topics or a pattern")
        changed = False
        if epoch == gp.JOIN_EPOCH:
            member, changed = self._join(req, now_ms)
        else:
            member = self.members.get(member_id)  # type: ignore[assignment]
            if member is None:
                raise errors.UnknownMemberIdError(f"member {member_id!r} is not in group {self.group_id!r}")
            owned = gp.tp_set(req["owned"])
            if epoch != member.member_epoch and not (epoch == member.previous_epoch and owned <= member.holds()):
                raise errors.FencedMemberEpochError(_epoch_refused(epoch, member))
            released = member.revoking - owned
            if released:
                member.revoking -= released
                changed = True
        member.deadline_ms = now_ms + timeout_ms
        if principal != member.principal:
            member.principal = principal
            changed = True
        if member.left_static:
            member.left_static = False
        subscription = (sorted(req["subscribed_topics"]), regex, timeout_ms)
        if subscription != (sorted(member.subscribed_topics), member.subscribed_topic_regex, member.session_timeout_ms):
            member.subscribed_topics, member.subscribed_topic_regex, member.session_timeout_ms = subscription
            self.group_epoch += 1
            changed = True
        self._compute_target(topic_partitions, may_describe)
        changed |= self._reconcile(member)
        waiting = bool(self._target[member.member_id] - member.assignment) or bool(member.revoking)
        return HeartbeatResult({
            "error": 0, "message": "", "member_id": member.member_id, "member_epoch": member.member_epoch,
            "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS_RECONCILING if waiting else HEARTBEAT_INTERVAL_MS_DEFAULT,
            "assignment": gp.tp_list(member.assignment),
        }, changed)

    def _join(self, req: dict[str, Any], now_ms: int) -> tuple[Member, bool]:
        instance_id = req["instance_id"]
        fenced = self.members.get(req["member_id"]) if req["member_id"] and not instance_id else None
        if fenced is not None:
            # A member rejoining under its id after FENCED_MEMBER_EPOCH (KIP-848): it has
            # given up what it held (on_partitions_lost), so its partitions are free now, not
            # when its old session would have ended (up to session_timeout_ms of nobody
            # reading them). A higher epoch fences whatever it still sends from before.
            del self.members[fenced.member_id]
            member = Member(fenced.member_id, "", fenced.member_epoch + 1, req["session_timeout_ms"],
                            list(req["subscribed_topics"]), req["subscribed_topic_regex"])
            self.members[member.member_id] = member
            self.group_epoch += 1
            return member, True
        if instance_id:
            previous = self._instance_owner(instance_id)
            if previous is not None:
                # A static member restarting (after a clean close or a crash) takes over its
                # old identity's partitions: no rebalance. The old member id is fenced
                # (_check_instance, check_commit). Only a join with no member id gets here
                # with someone else's instance: a process that rejoins with its old member id
                # was refused by _check_instance if the instance has moved on since.
                del self.members[previous.member_id]
                self._replaced[previous.member_id] = instance_id
                while len(self._replaced) > REPLACED_MEMBER_IDS_MAX:
                    del self._replaced[next(iter(self._replaced))]
                member = Member(self._new_member_id(), instance_id, previous.member_epoch + 1,
                                previous.session_timeout_ms, previous.subscribed_topics,
                                previous.subscribed_topic_regex, set(previous.assignment), set(previous.revoking),
                                previous_epoch=previous.member_epoch)
                # The new process holds nothing yet: whatever the old one was revoking is released.
                member.revoking = set()
                self.members[member.member_id] = member
                return member, True
        if len(self.members) >= GROUP_MEMBERS_MAX:
            raise errors.GroupMaxSizeReachedError(f"group {self.group_id!r} has GROUP_MEMBERS_MAX={GROUP_MEMBERS_MAX} members")
        member = Member(self._new_member_id(), instance_id, 1, req["session_timeout_ms"],
                        list(req["subscribed_topics"]), req["subscribed_topic_regex"])
        self.members[member.member_id] = member
        self.group_epoch += 1
        return member, True

    def _check_instance(self, member_id: str, instance_id: str) -> None:
        """Refuse (FENCED_INSTANCE_ID) a request from ``member_id`` naming an instance id that
        a different member holds now: a later join with that instance id replaced it."""
        owner = self._instance_owner(instance_id)
        if owner is not None and owner.member_id != member_id:
            raise errors.FencedInstanceIdError(
                f"member {member_id!r} of group {self.group_id!r} was replaced: member {owner.member_id!r} "
                f"joined later with its instance id {instance_id!r}")

    def _instance_owner(self, instance_id: str) -> Member | None:
        if not instance_id:
            return None
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def _leave(self, member_id: str, epoch: int) -> HeartbeatResult:
        member = self.members.get(member_id)
        if member is None:
            raise errors.UnknownMemberIdError(f"member {member_id!r} is not in group {self.group_id!r}")
        if epoch == gp.STATIC_LEAVE_EPOCH and member.instance_id:
            # Keep the partitions for the session timeout: a restart within it gets them back.
            member.left_static = True
            return HeartbeatResult({"error": 0, "message": "", "member_id": member_id, "member_epoch": epoch,
                                    "heartbeat_interval_ms": 0, "assignment": []}, False)
        del self.members[member_id]
        self.group_epoch += 1
        self._target_stale = True
        return HeartbeatResult({"error": 0, "message": "", "member_id": member_id, "member_epoch": gp.LEAVE_EPOCH,
                                "heartbeat_interval_ms": 0, "assignment": []}, True)

    def expire(self, now_ms: int) -> list[str]:
        """Remove members whose session ended; their partitions become free. Returns their ids."""
        gone = [m.member_id for m in self.members.values() if m.deadline_ms <= now_ms]
        for member_id in gone:
            del self.members[member_id]
        if gone:
            self.group_epoch += 1
            self._target_stale = True
        return gone

    @staticmethod
    def _resolve(member: Member, topic_partitions: dict[str, int], may_describe: MayDescribe | None = None) -> set[str]:
        topics = {t for t in member.subscribed_topics if t in topic_partitions}
        if member.subscribed_topic_regex:
            pattern = gp.compile_topic_pattern(member.subscribed_topic_regex)
            # Internal topics (names starting "__") are never matched by a pattern, nor
            # on a secure cluster are topics the member's principal may not describe.
            # (A topic named explicitly stays: the member's fetch then says it is refused.)
            topics |= {t for t in topic_partitions if not t.startswith("__") and pattern.fullmatch(t)
                       and (may_describe is None or may_describe(member.principal, t))}
        return topics

    def _compute_target(self, topic_partitions: dict[str, int], may_describe: MayDescribe | None) -> None:
        self._target_stale = False
        subscriptions = {m.member_id: self._resolve(m, topic_partitions, may_describe) for m in self.members.values()}
        current = {m.member_id: m.assignment for m in self.members.values()}
        self._target = assign(subscriptions, topic_partitions, current)

    def _reconcile(self, member: Member) -> bool:
        """Move ``member`` toward its target: revoke what it should give up at once, add what
        it should get as soon as no other member holds it."""
        target = self._target.get(member.member_id, set())
        held_by_others: set[TopicPartition] = set()
        for other in self.members.values():
            if other is not member:
                held_by_others |= other.holds()
        keep = member.assignment & target
        gain = {tp for tp in target - member.assignment if tp not in held_by_others and tp not in member.revoking}
        revoke = member.assignment - target
        new_assignment = keep | gain
        if new_assignment == member.assignment and not revoke:
            return False
        member.revoking |= revoke
        member.assignment = new_assignment
        member.previous_epoch = member.member_epoch
        member.member_epoch += 1
        return True

    # -- offsets --------------------------------------------------------------------------
    def check_commit(self, member_id: str, member_epoch: int, tps: list[TopicPartition]) -> list[int]:
        """The error code for each partition of an OFFSET_COMMIT (0 = may commit)."""
        if not member_id:
            # A consumer outside the group protocol (assign() with a group id, or the admin's
            # reset-offsets) may commit only while no member is live: otherwise it would move
            # offsets under a member that is reading.
            code = errors.GroupNotEmptyError.code if self.members else 0
            return [code] * len(tps)
        member = self.members.get(member_id)
        if member is None:
            owner = self._instance_owner(self._replaced.get(member_id, ""))
            if owner is not None:  # a static join replaced it, and that instance is still live
                return [errors.FencedInstanceIdError.code] * len(tps)
            return [errors.UnknownMemberIdError.code] * len(tps)
        if member_epoch not in (member.member_epoch, member.previous_epoch):
            return [errors.FencedMemberEpochError.code] * len(tps)
        holds = member.holds()
        return [0 if tp in holds else errors.FencedMemberEpochError.code for tp in tps]

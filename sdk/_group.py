"""Group membership for the consumer: find the coordinator, heartbeat, reconcile, commit.

The member side of the protocol in docs/GROUPS.md (KIP-848's shape). It runs on the
consumer's thread, inside ``poll()``: a heartbeat is one short request when it is due, so
there is no second thread touching the consumer's sockets. The price is Kafka's
``max.poll.interval.ms`` rule in another form: an application that does not call
``poll()`` for longer than the session timeout is removed from the group. The member then
treats its partitions as lost before it hands out another record (it checks its own
session clock), so a paused process never reads a partition that moved.

Reconciling an assignment is done in this order, which is what keeps a partition from
ever being read by two members: revoke first (commit its position, call
``on_partitions_revoked``, drop its buffered data), then report the smaller ownership in
the next heartbeat, sent at once; only then can the coordinator give it to someone else.

A heartbeat answer with no error is checked before anything of it is taken (``_answer_fault``):
one no coordinator could send (an epoch below 1, no member id, another member id than the
one a member in the group sent, an assignment naming a negative partition, one twice, or a
topic the member did not subscribe to) is refused
whole: poll() raises, and the coordinator is found again. (Kafka's classic consumer does
not take an assignment that does not match its subscription either; it rejoins.) Assigned
partitions the member's routing map does not list yet (a topic just grown, a pattern's
new topic) wait, as Kafka's "unresolved" ones do, until a re-read of the map lists them;
the rest of the assignment is taken at once.

FENCED_INSTANCE_ID (another process joined with this member's ``instance_id``) is fatal,
as Kafka's FencedInstanceIdException: the member gives its partitions up as lost, stops,
and raises to the application from every later poll() and commit(). It never rejoins:
rejoining would take the instance back from the other process, whose SDK would take it
back in turn, and both would read the partitions in turns for ever.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from fabric import errors
from fabric.limits import PARTITIONS_MAX
from fabric.protocol import groups as gp
from fabric.protocol.apis import ApiKey
from sdk._client import TopicPartition

if TYPE_CHECKING:
    from sdk.consumer import Consumer

log = logging.getLogger("fabric.group")

COORDINATOR_RETRY_MS: Final[int] = 100
CONNECT_WAIT_MS: Final[int] = 1_000  # a request to a node not connected yet waits this long to connect (at most)
GROUP_REQUEST_TIMEOUT_MS: Final[int] = 10_000  # one commit or offset fetch
HEARTBEAT_TIMEOUT_MS_MIN: Final[int] = 500
# A coordinator gives 32 hex characters (nodes/group_state.py); an id past this many UTF-8
# bytes (the bound of group ids and topic names) is no coordinator's, and would go out in
# every later heartbeat and commit.
MEMBER_ID_BYTES_MAX: Final[int] = 200
# How often the routing map is read again while assigned partitions wait for it to list them.
PENDING_RECHECK_MS: Final[int] = 250
# What a ConsumerRebalanceListener must have: plain methods, called on the consumer's thread.
LISTENER_HOOKS: Final[tuple[str, ...]] = ("on_partitions_revoked", "on_partitions_assigned", "on_partitions_lost")


class OffsetAndMetadata(NamedTuple):
    """A committed offset as Kafka's ``OffsetAndMetadata`` (kafka-python's field names):
    ``Consumer.committed(tp, metadata=True)`` returns one, and ``commit()`` takes one.

    ``metadata`` is the string committed with the offset ("" when none was given).
    ``leader_epoch`` is always None: Fabric's OFFSET_COMMIT carries no leader epoch
    (docs/PROTOCOL.md), so there is none to give back; the field is here so code written
    for Kafka's clients reads it without a change."""

    offset: int
    metadata: str
    leader_epoch: int | None = None


class ConsumerRebalanceListener:
    """Override what you need. Called on the consumer's thread, inside the call that
    heartbeats or leaves: ``subscribe()``, ``poll()`` (and iteration), ``unsubscribe()`` and
    ``close()``. An exception a hook raises comes out of that call (from ``unsubscribe()``
    and ``close()``, once the member has left the group and, for ``close()``, is closed).

    ``on_partitions_revoked`` runs before the partitions go to another member (commit or
    flush there), and at ``unsubscribe()`` and ``close()`` for the partitions held then;
    ``on_partitions_lost`` when the member was removed (session expired, fenced): another
    member may already own them, so do not commit.

    The hooks are plain methods, called and never awaited: with the asyncio consumer they
    run on its worker thread, where no event loop runs, so ``subscribe()`` refuses a
    listener with an ``async def`` hook (TypeError). Hand async work to the loop with
    ``asyncio.run_coroutine_threadsafe(coroutine, loop)``.
    """

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        pass

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        pass

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        self.on_partitions_revoked(lost)


class GroupMember:
    def __init__(self, consumer: Consumer, group_id: str, *, instance_id: str | None, session_timeout_ms: int,
                 heartbeat_interval_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        gp.check_group_id(group_id)
        if heartbeat_interval_ms <= 0 or heartbeat_interval_ms >= session_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms={heartbeat_interval_ms} must be > 0 and below "
                             f"session_timeout_ms={session_timeout_ms}")
        self.consumer = consumer
        self.group_id = group_id
        self.instance_id = instance_id or ""
        self.session_timeout_ms = session_timeout_ms
        # One heartbeat waits at most this long (then the next is sent to a coordinator
        # found again): a request lost to a dying node must not block poll() for a session.
        self.heartbeat_timeout_ms = max(HEARTBEAT_TIMEOUT_MS_MIN, min(heartbeat_interval_ms, session_timeout_ms // 4))
        # The member gives its partitions up this much before the coordinator could expire
        # it, so records already handed out have time to be processed before anyone else
        # may get the partition (the coordinator counts from when it saw the heartbeat,
        # which is after we sent it; we count from the send).
        self.fence_margin_ms = min(session_timeout_ms // 5, 2 * heartbeat_interval_ms)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._clock = clock
        self.member_id = ""
        self.member_epoch = gp.JOIN_EPOCH
        self.owned: set[TopicPartition] = set()
        # Assigned by the last answer but not listed by the routing map yet: taken once it is.
        self.pending: set[TopicPartition] = set()
        self._pending_check_s = 0.0
        self.topics: list[str] = []
        self.pattern = ""
        self.listener = ConsumerRebalanceListener()
        self.subscribed = False
        self._coordinator: str | None = None
        self._next_heartbeat_s = 0.0
        self._last_ok_s = clock()
        # Why this member was fenced (FENCED_INSTANCE_ID), "" while it was not: for good.
        self.fenced = ""

    # -- subscription --------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] | None, pattern: str | None,
                  listener: ConsumerRebalanceListener | None) -> None:
        self.raise_if_fenced()
        if pattern:
            try:
                gp.compile_topic_pattern(pattern)
            except errors.InvalidRequestError as exc:
                raise ValueError(exc.message) from None
        if listener is not None and not all(callable(getattr(listener, hook, None)) for hook in LISTENER_HOOKS):
            # Checked now: a missing hook would otherwise fail inside a later poll().
            raise TypeError(f"listener must be a ConsumerRebalanceListener, got {type(listener).__name__}")
        coroutines = [hook for hook in LISTENER_HOOKS if inspect.iscoroutinefunction(getattr(listener, hook, None))]
        if coroutines:
            # The hooks are called, never awaited, on the consumer's thread (the asyncio
            # consumer's worker, where no loop runs): an ``async def`` hook only made a
            # coroutine nobody ran, and the application never heard of its partitions.
            raise TypeError(
                f"listener {type(listener).__name__}: {', '.join(coroutines)} must be a plain def, not async def: the "
                "consumer calls its hooks on its own thread and does not await them (schedule async work on your "
                "loop with asyncio.run_coroutine_threadsafe from there)")
        self.topics = sorted(set(topics or ()))
        self.pattern = pattern or ""
        if not self.topics and not self.pattern:
            raise ValueError("subscribe() needs topics or a pattern")
        self.listener = listener or ConsumerRebalanceListener()
        self.subscribed = True
        self._next_heartbeat_s = 0.0  # tell the coordinator now

    # -- the heartbeat loop ------------------------------------------------------------------
    def tick(self) -> None:
        """Called from poll(): heartbeat if due, and apply what the coordinator says."""
        if not self.fenced and self.subscribed:
            self._tick()
        if self.fenced:
            self._lose()  # lost, not revoked: the other process owns them now, so no commit
            self.raise_if_fenced()

    def due(self) -> bool:
        """Whether ``tick`` has work now: a heartbeat is due, or the session clock says the
        partitions are lost. Cheap (no request): an iterator asks it between records."""
        if self.fenced:
            return True  # tick() raises FencedInstanceIdError, as every later poll does
        if not self.subscribed:
            return False
        now = self._clock()
        return now >= self._next_heartbeat_s or bool(self.pending and now >= self._pending_check_s) or bool(
            self.owned and (now - self._last_ok_s) * 1000 > self.session_timeout_ms - self.fence_margin_ms)

    def raise_if_fenced(self) -> None:
        if self.fenced:
            raise errors.FencedInstanceIdError(self.fenced, group_id=self.group_id, instance_id=self.instance_id)

    def _fence(self, detail: str) -> None:
        """Remember that the coordinator answered FENCED_INSTANCE_ID; ``tick`` acts on it."""
        if not self.fenced:
            log.error("group %s: fenced: %s", self.group_id, detail)
        self.fenced = (f"another consumer joined group {self.group_id!r} with instance id {self.instance_id!r}: "
                       f"this one is fenced, reads none of the group's partitions and does not rejoin; close it "
                       f"(two live consumers must not share an instance id)")

    def _unheard_left_s(self) -> float:
        """How long this member may still hold its partitions without a heartbeat answered:
        past that the coordinator may give them away (inf when it holds none)."""
        if not self.owned:
            return math.inf
        return self._last_ok_s + (self.session_timeout_ms - self.fence_margin_ms) / 1000.0 - self._clock()

    def _drop_unheard(self) -> None:
        # We have not been heard for (nearly) a whole session: the coordinator may give our
        # partitions away. Drop them before another record is handed out.
        log.warning("group %s: no heartbeat answered for %d ms; partitions lost", self.group_id,
                    self.session_timeout_ms - self.fence_margin_ms)
        self._lose()

    def _tick(self) -> None:
        now = self._clock()
        if self.owned and self._unheard_left_s() < 0:
            self._drop_unheard()
        denied: list[str] = []
        if self.pending and now >= self._pending_check_s:
            denied = self._recheck_pending(now, self.pending)
        if now >= self._next_heartbeat_s:
            self._heartbeat(now)
        denied = sorted(set(denied) & {tp.topic for tp in self.pending})  # the heartbeat may have taken them back
        if denied:
            # Named in subscribe() (the coordinator assigns a named topic whoever asks), but
            # this principal may not describe it: poll() says so, as Kafka's consumer raises
            # TopicAuthorizationException, each time the map is read again (the heartbeat
            # went first: the membership holds). Its other partitions are read meanwhile.
            raise errors.AuthorizationFailedError(
                f"group {self.group_id}: assigned partitions of {', '.join(map(repr, denied[:20]))}, which this "
                "principal may not describe (docs/SECURITY.md)", group_id=self.group_id)

    def _listed(self, tp: TopicPartition) -> bool:
        """Whether the routing map lists ``tp`` (so it can be read)."""
        topic = self.consumer._meta.metadata.topics.get(tp.topic)
        return topic is not None and tp.partition < topic.partition_count

    def _recheck_pending(self, now: float, pending: set[TopicPartition], *, heartbeat: bool = True) -> list[str]:
        """Read the map of the ``pending`` partitions' topics again (the next time in
        PENDING_RECHECK_MS). With ``heartbeat``, once it lists one, heartbeat now: that
        answer (the coordinator's latest word, which may have taken it back) is taken with it.
        Returns the topics among them this principal may not describe."""
        self._pending_check_s = now + PENDING_RECHECK_MS / 1000.0
        try:
            self.consumer._refresh(sorted({tp.topic for tp in pending}))
        except errors.FabricError as exc:
            log.debug("group %s: routing map not read again (%s)", self.group_id, exc)
            return []
        if heartbeat and any(self._listed(tp) for tp in pending):
            self._next_heartbeat_s = 0.0
        return sorted({tp.topic for tp in pending} & self.consumer._meta.denied)

    def _heartbeat(self, now: float) -> None:
        # The answer is checked against what was sent: the subscription, and who sent it.
        topics, pattern, member_id, epoch = self.topics, self.pattern, self.member_id, self.member_epoch
        body = {"group_id": self.group_id, "member_id": member_id, "member_epoch": epoch,
                "instance_id": self.instance_id, "session_timeout_ms": self.session_timeout_ms,
                "subscribed_topics": topics, "subscribed_topic_regex": pattern,
                "owned": gp.tp_list((tp.topic, tp.partition) for tp in self.owned)}
        try:
            response = self._call(ApiKey.CONSUMER_GROUP_HEARTBEAT, body, attempts=1, timeout_ms=self.heartbeat_timeout_ms,
                                  budget_ms=self.heartbeat_timeout_ms)
        except errors.FabricError as exc:
            if not exc.retriable and not isinstance(exc, errors.NoBrokersAvailableError):
                raise
            self._next_heartbeat_s = now + COORDINATOR_RETRY_MS / 1000.0
            return
        code = response["error"]
        if code == errors.FencedInstanceIdError.code:
            self._fence(response["message"])
            return
        if code in (errors.UnknownMemberIdError.code, errors.FencedMemberEpochError.code):
            log.warning("group %s: %s; rejoining", self.group_id, response["message"])
            # Fenced: rejoin under the same id, so the coordinator frees what the old
            # epoch held at once instead of after its session (an unknown id joins anew).
            self._lose(keep_member_id=code == errors.FencedMemberEpochError.code)
            self._next_heartbeat_s = 0.0
            return
        if code:
            cls = errors.error_for_code(code)
            if cls.retriable:
                self._coordinator = None
                self._next_heartbeat_s = now + COORDINATOR_RETRY_MS / 1000.0
                return
            raise cls(response["message"])
        fault = _answer_fault(response, topics, pattern, member_id, epoch)
        if fault:
            # Nothing of the answer is taken (the session clock still runs from the last
            # good one); the coordinator is found again before the next heartbeat, paced as
            # after a retriable error, and poll() says why.
            self._coordinator = None
            self._next_heartbeat_s = now + COORDINATOR_RETRY_MS / 1000.0
            raise errors.UnknownServerError(
                f"group {self.group_id}: the coordinator answered the heartbeat with {fault}: answer ignored",
                group_id=self.group_id, member_epoch=response["member_epoch"])
        self._last_ok_s = now
        self.member_id = response["member_id"]
        self.member_epoch = response["member_epoch"]
        target = {TopicPartition(t, p) for t, p in gp.tp_set(response["assignment"])}
        revoked = self.owned - target
        interval_ms = min(self.heartbeat_interval_ms, max(0, response["heartbeat_interval_ms"]))
        self._next_heartbeat_s = now + interval_ms / 1000.0
        if revoked:
            # Commit, tell the application (it may commit too), then stop reading them.
            ordered = sorted(revoked, key=str)
            self.consumer._commit_before_revoke(ordered)
            self.listener.on_partitions_revoked(ordered)
            self.consumer._drop(ordered)
            self.owned -= revoked
            self._next_heartbeat_s = 0.0  # confirm the revocation at once: someone is waiting
            if self.fenced:
                return  # that commit found us replaced: take nothing more, tick() stops the member
        # A partition the map does not list cannot be read (no leader, no position): the
        # map is read again once (a first join, a new topic), and what it still does not
        # list waits, unreported, while the rest is taken now (after the revocations,
        # which someone is waiting for). Before, the whole answer waited
        # PARTITION_LEARN_WAIT_MS for it inside the heartbeat, then took nothing.
        pending = {tp for tp in target - self.owned if not self._listed(tp)}
        if pending - self.pending:
            self._recheck_pending(now, pending, heartbeat=False)
            pending = {tp for tp in pending if not self._listed(tp)}
            if pending - self.pending:
                log.info("group %s: assigned %s, not in the routing map yet: read once it lists them",
                         self.group_id, ", ".join(sorted(map(str, pending - self.pending))[:20]))
        self.pending = pending
        added = target - self.owned - pending
        if added:
            ordered = sorted(added, key=str)
            try:
                self.consumer._add(ordered)
            except errors.FabricError as exc:
                # Without the committed offsets we must not start reading (auto_offset_reset
                # would re-read or skip): take them at the next heartbeat instead.
                log.warning("group %s: could not read committed offsets (%s); retrying", self.group_id, exc)
                self._next_heartbeat_s = now + COORDINATOR_RETRY_MS / 1000.0
                return
            self.owned |= added
            self.listener.on_partitions_assigned(ordered)

    def _lose(self, *, keep_member_id: bool = False) -> None:
        lost = sorted(self.owned, key=str)
        self.owned = set()
        self.pending = set()
        self.member_id = "" if not (self.instance_id or keep_member_id) else self.member_id
        self.member_epoch = gp.JOIN_EPOCH
        if lost:
            self.consumer._drop(lost)
            self.listener.on_partitions_lost(lost)

    def leave(self, *, rejoin_later: bool = False) -> None:
        """Leave the group now (a static member keeps its partitions for the session).
        ``rejoin_later`` (unsubscribe): a later subscribe() joins as a new member."""
        if self.fenced:
            # Nothing to tell the coordinator (it would refuse it), and a fenced member
            # never joins again: subscribe() raises.
            self._lose()
            self.subscribed = False
            return
        if not self.subscribed or not self.member_id:
            return
        hook_error: Exception | None = None
        if self.owned:
            # As Kafka's close(): the application hears that it no longer reads these. What
            # the hook raises is raised once the member has left: raised from here, it left
            # the member in the group (its partitions held until its session timed out).
            try:
                self.listener.on_partitions_revoked(sorted(self.owned, key=str))
            except Exception as exc:  # the application's own, whatever it is
                hook_error = exc
        epoch = gp.STATIC_LEAVE_EPOCH if self.instance_id else gp.LEAVE_EPOCH
        body = {"group_id": self.group_id, "member_id": self.member_id, "member_epoch": epoch,
                "instance_id": self.instance_id, "session_timeout_ms": self.session_timeout_ms,
                "subscribed_topics": self.topics, "subscribed_topic_regex": self.pattern, "owned": []}
        try:
            self._call(ApiKey.CONSUMER_GROUP_HEARTBEAT, body, attempts=2, timeout_ms=self.heartbeat_timeout_ms,
                       budget_ms=2 * self.heartbeat_timeout_ms)
        except errors.FabricError as exc:
            log.info("group %s: leave not acknowledged (%s); the session timeout will end it", self.group_id, exc)
        self.subscribed = False
        self.owned = set()
        self.pending = set()
        if rejoin_later:
            self.member_id = "" if not self.instance_id else self.member_id
            self.member_epoch = gp.JOIN_EPOCH
        if hook_error is not None:
            raise hook_error

    # -- offsets ----------------------------------------------------------------------------
    def commit(self, offsets: dict[TopicPartition, tuple[int, str]], *, in_group: bool) -> None:
        if not offsets:
            return
        body = {"group_id": self.group_id,
                "member_id": self.member_id if in_group else "",
                "member_epoch": self.member_epoch if in_group else -1,
                "offsets": [{"topic": tp.topic, "partition": tp.partition, "offset": off, "metadata": meta}
                            for tp, (off, meta) in sorted(offsets.items(), key=lambda kv: str(kv[0]))]}
        response = self._call(ApiKey.OFFSET_COMMIT, body)
        errors.raise_for_code(response["error"], response["message"])
        if any(r["error"] == errors.FencedInstanceIdError.code for r in response["results"]):
            # Told before our next heartbeat was: the member stops at the next poll().
            self._fence(f"commit refused with FENCED_INSTANCE_ID, member {self.member_id!r}")
            self.raise_if_fenced()
        for result in response["results"]:
            if result["error"]:
                errors.raise_for_code(result["error"], f"commit of {result['topic']}/{result['partition']} refused",
                                      topic=result["topic"], partition=result["partition"])

    def committed(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, str] | None]:
        body = {"group_id": self.group_id, "partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in tps]}
        response = self._call(ApiKey.OFFSET_FETCH, body)
        errors.raise_for_code(response["error"], response["message"])
        return {TopicPartition(o["topic"], o["partition"]): None if o["offset"] < 0 else (o["offset"], o["metadata"])
                for o in response["offsets"]}

    # -- finding the coordinator ------------------------------------------------------------
    def _call(self, api_key: int, body: dict[str, Any], *, attempts: int = 0,
              timeout_ms: int = GROUP_REQUEST_TIMEOUT_MS, budget_ms: int | None = None) -> dict[str, Any]:
        """One request to the coordinator; retriable failures re-find it, until the request
        timeout (or ``attempts``) runs out. Returns the body, which may carry an error.
        The whole call, finding the coordinator and re-reading the map included, ends by
        the request timeout, ``budget_ms`` and the bound of the consumer call it is part
        of (one try used to ask every node for the coordinator and re-read the map, about
        40 s with every node paused, before the deadline was even looked at)."""
        now = time.monotonic()
        # A member holding partitions waits no longer than it may hold them unheard (``_tick``):
        # a commit to a paused coordinator waited 10 s while its successor gave the partitions
        # to another member after the session (6 s), and both held them meanwhile.
        unheard_left_s = self._unheard_left_s() if api_key != ApiKey.CONSUMER_GROUP_HEARTBEAT else math.inf
        deadline = min(now + self.consumer.request_timeout_ms / 1000.0, self.consumer._work_by_s,
                       math.inf if budget_ms is None else now + budget_ms / 1000.0, now + max(0.0, unheard_left_s))
        tries = 0
        while True:
            tries += 1
            try:
                address = self._coordinator or self._find_coordinator(timeout_ms, deadline)
                left_ms = _left_ms(timeout_ms, deadline)
                response = self.consumer._conns.request(address, api_key, body, timeout_ms=left_ms,
                                                        wait_connect_ms=min(left_ms, CONNECT_WAIT_MS)).body
                code = response.get("error", 0)
                if code and errors.error_for_code(code).retriable and api_key != ApiKey.CONSUMER_GROUP_HEARTBEAT:
                    raise errors.error_for_code(code)(response.get("message", ""))
                if code in (errors.NotCoordinatorError.code, errors.CoordinatorNotAvailableError.code):
                    self._coordinator = None
                return response
            except errors.FabricError as exc:
                if not exc.retriable and not isinstance(exc, errors.NoBrokersAvailableError):
                    raise
                self._coordinator = None
                if (attempts and tries >= attempts) or time.monotonic() >= deadline:
                    if self.owned and self._unheard_left_s() <= 0:
                        self._drop_unheard()
                        raise errors.RequestTimedOutError(
                            f"group {self.group_id}: the coordinator did not answer before this member's session "
                            "could end: its partitions are lost (on_partitions_lost ran); poll() joins again") from exc
                    raise
                time.sleep(min(COORDINATOR_RETRY_MS / 1000.0, max(0.0, deadline - time.monotonic())))

    def _find_coordinator(self, timeout_ms: int = GROUP_REQUEST_TIMEOUT_MS, deadline: float = math.inf) -> str:
        meta = self.consumer._meta
        bound = None if deadline == math.inf else deadline
        last: errors.FabricError | None = None
        for address in meta.candidates(deadline_s=bound):
            try:
                left_ms = _left_ms(timeout_ms, deadline)
            except errors.RequestTimedOutError as exc:
                last = exc
                break
            try:
                response = self.consumer._conns.request(
                    address, ApiKey.FIND_COORDINATOR, {"group_id": self.group_id}, timeout_ms=left_ms,
                    wait_connect_ms=min(left_ms, CONNECT_WAIT_MS)).body
            except errors.FabricError as exc:
                if isinstance(exc, errors.AuthorizationFailedError):
                    raise  # every node would refuse the same: not "no coordinator", retried for ever
                # Asked last from now on: a node gone from this address (dead, or restarted
                # on another port) must not take every heartbeat's whole wait while the next
                # address in the map would answer.
                meta.unanswered(address)
                last = exc
                continue
            meta.answered(address)
            if response["error"]:
                errors.raise_for_code(response["error"], response["message"])
            self._coordinator = response["address"]
            return response["address"]
        # No address answered. Once every address we know has failed (each is asked last
        # after it failed once, so a single dead node costs one heartbeat), ask the
        # bootstrap where the nodes are now, by the bound of the consumer call this is part
        # of (a poll's timeout plus POLL_WORK_MS), not by this request's spent budget. A
        # member that has lost its partitions fetches nothing, so nothing else re-reads its
        # map: after every node had restarted on other ports it asked the same dead
        # addresses for ever and never rejoined (a soak: 9 minutes, until it was killed).
        consumer_bound = self.consumer._deadline_s()
        if meta.rediscover_if_lost(consumer_bound if consumer_bound is not None else bound):
            raise errors.CoordinatorNotAvailableError(
                f"no node answered FIND_COORDINATOR for {self.group_id!r}: {last}")
        try:
            meta.refresh(deadline_s=bound)
        except errors.FabricError:
            pass
        raise errors.CoordinatorNotAvailableError(f"no node answered FIND_COORDINATOR for {self.group_id!r}: {last}")


def _answer_fault(response: dict[str, Any], topics: list[str], pattern: str, member_id_sent: str,
                  epoch_sent: int) -> str:
    """What makes a heartbeat answer with no error one that no coordinator sends ("" when
    nothing does), given the subscription the heartbeat carried (the coordinator assigns
    from that one, nodes/group_state.py) and the member id and epoch it was sent with.
    Stored, each of these went out again or was read:

    * a member epoch of 0 or below (a coordinator gives 1 or more): in the next heartbeat a
      leave, or a rejoin that freed our partitions for others while we still read them;
    * a member id that is empty, not a string or longer than MEMBER_ID_BYTES_MAX: the next
      heartbeat was UNKNOWN_MEMBER_ID, the partitions lost and a rejoin;
    * a member id other than the one sent, answering a member in the group (epoch above 0):
      a coordinator answers such a heartbeat with the member it names, or with an error
      (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, FENCED_INSTANCE_ID). Only a join (epoch 0)
      gets a new id: a first one, a static member's every join (the instance taken over
      under a new id), a rejoin under an id the group no longer knows. Stored, it went out
      in the next heartbeat and every commit: another member's id, or one the group does
      not know (UNKNOWN_MEMBER_ID: the partitions lost and a rejoin);
    * a negative partition (taken, with no leader: the map was re-read at every poll), one
      at PARTITIONS_MAX or above (no topic ever has it), a topic or partition listed twice
      (Kafka's client keeps a topic's last entry, ``tp_set`` took the union: the answer
      means nothing sure);
    * a topic the member neither named nor matches with its pattern (a pattern never
      matches an internal ``__`` topic, as on the coordinator): fetched and committed.

    Partitions past the count the member's map knows are not here: a topic may have grown
    (they wait in ``GroupMember.pending``)."""
    epoch = response["member_epoch"]
    if epoch <= gp.JOIN_EPOCH:
        return f"member epoch {epoch} (a coordinator gives 1 or more)"
    member_id = response["member_id"]
    if not isinstance(member_id, str) or not member_id or len(member_id.encode("utf-8")) > MEMBER_ID_BYTES_MAX:
        return (f"member id {str(member_id)[:40]!r} of type {type(member_id).__name__} (a coordinator gives "
                f"1 to MEMBER_ID_BYTES_MAX={MEMBER_ID_BYTES_MAX} bytes)")
    if epoch_sent > gp.JOIN_EPOCH and member_id != member_id_sent:
        return (f"member id {member_id[:40]!r} to member {member_id_sent[:40]!r} at epoch {epoch_sent} (a "
                "coordinator answers a member in the group under the id it sent; only a join gets a new one)")
    named = set(topics)
    matcher = gp.compile_topic_pattern(pattern) if pattern else None
    seen: set[str] = set()
    for entry in response["assignment"]:
        topic, partitions = entry["topic"], entry["partitions"]
        if topic in seen:
            return f"topic {topic[:200]!r} listed twice in its assignment"
        seen.add(topic)
        if topic not in named and not (matcher is not None and not topic.startswith("__")
                                       and matcher.fullmatch(topic)):
            return f"an assignment of topic {topic[:200]!r}, which the member did not subscribe to"
        if len(set(partitions)) != len(partitions):
            return f"partitions of {topic[:200]!r} listed twice in its assignment"
        if not all(0 <= p < PARTITIONS_MAX for p in partitions):
            wrong = next(p for p in partitions if not 0 <= p < PARTITIONS_MAX)
            return (f"partition {wrong} of {topic[:200]!r} in its assignment (partitions are 0 to "
                    f"PARTITIONS_MAX-1={PARTITIONS_MAX - 1})")
    return ""


def _left_ms(timeout_ms: int, deadline: float) -> int:
    """``timeout_ms`` cut to what is left until ``deadline`` (``time.monotonic()``);
    RequestTimedOutError (retriable) when nothing is."""
    if deadline == math.inf:
        return timeout_ms
    left_ms = math.ceil((deadline - time.monotonic()) * 1000)
    if left_ms <= 0:
        raise errors.RequestTimedOutError("the group call ran out of its time")
    return min(timeout_ms, left_ms)

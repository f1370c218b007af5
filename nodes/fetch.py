"""FETCH with long-poll parking: a fetch that finds too little data waits on the node.

A consumer waiting at the log end sleeps here until new data (or a moved high watermark)
reaches ``min_bytes``, or ``max_wait_ms`` passes: push-like latency without busy
polling. At most ``PARKED_FETCHES_MAX`` fetches wait; beyond that a fetch is answered at
once with what there is. The decision "answer now or park" is ``fetch_ready``, a pure
rule the unit tests feed numbers, as is ``read_limit`` (what a consumer or a follower
may read).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fabric import errors
from fabric.limits import FETCH_BYTES_MAX, FETCH_WAIT_MS_MAX, PARKED_FETCHES_MAX
from fabric.protocol import apis
from fabric.protocol.header import Header
from fabric.protocol.tags import TagFilter
from nodes import leader as leader_side
from nodes.state import Envelope, NodeState, TopicPartition, envelope_identity
from nodes.tag_filter import read_filtered


@dataclass
class ParkedFetch:
    envelope: Envelope
    header: Header
    body: dict[str, Any]
    deadline: float  # monotonic seconds
    keys: set[TopicPartition] = field(default_factory=set)


def fetch_ready(*, final: bool, any_error: bool, bytes_found: int, min_bytes: int) -> bool:
    """Answer now (True) or keep the fetch parked (False).

    An error, the deadline (``final``) or ``min_bytes`` answers. ``min_bytes=0`` asks for
    an answer at once, even an empty one (docs/PROTOCOL.md section 5.3, as Kafka); a
    consumer that wants to long-poll at the log end sends ``min_bytes=1``.
    """
    return final or any_error or bytes_found >= min_bytes


def read_limit(replica_id: int, high_watermark: int, log_end_offset: int, fetch_offset: int) -> int | None:
    """The offset a fetch may read up to, or None: nothing to read yet, wait.

    Consumers read only what every in-sync replica has (below the high watermark);
    followers read the whole log. An offset above that limit but inside the log waits;
    one outside the log is read, and the read reports it out of range.
    """
    limit = high_watermark if replica_id == apis.CONSUMER_REPLICA_ID else log_end_offset
    if limit < fetch_offset <= log_end_offset:
        return None
    return limit


def handle_fetch(node: NodeState, envelope: Envelope, request: apis.Message) -> None:
    body = request.body
    if not 0 <= body["max_wait_ms"] <= FETCH_WAIT_MS_MAX:
        raise errors.InvalidRequestError(f"max_wait_ms={body['max_wait_ms']} outside [0, {FETCH_WAIT_MS_MAX}]")
    if body["max_bytes"] <= 0 or body["min_bytes"] < 0:
        raise errors.InvalidRequestError("max_bytes must be positive and min_bytes non-negative")
    body["parsed_tag_filter"] = TagFilter(body["tag_filter"]) if body.get("tag_filter") else None
    fetch = ParkedFetch(
        envelope,
        request.header,
        body,
        time.monotonic() + body["max_wait_ms"] / 1000.0,
        {(p["topic"], p["partition"]) for p in body["partitions"]},
    )
    if body["replica_id"] >= 0:
        leader_side.record_replica_fetch(node, body)
    if not try_answer(node, fetch, final=body["max_wait_ms"] == 0):
        if len(node.parked) >= PARKED_FETCHES_MAX:
            try_answer(node, fetch, final=True)
        else:
            node.parked.append(fetch)


def try_answer(node: NodeState, fetch: ParkedFetch, *, final: bool) -> bool:
    """Answer if there is enough data, an error, or ``final``; else leave it parked."""
    body = fetch.body
    identity = envelope_identity(fetch.envelope)
    # Past its unread answers' bound a client reads nothing: parked, then answered empty.
    budget = min(body["max_bytes"], FETCH_BYTES_MAX, node.reply_budget.room(identity))
    results: list[dict[str, Any]] = []
    frames: list[Any] = []
    total = 0
    any_error = False
    for p in body["partitions"]:
        result = {"topic": p["topic"], "partition": p["partition"], "error": 0, "high_watermark": -1,
                  "log_start_offset": -1, "log_end_offset": -1, "batch_count": 0,
                  "next_fetch_offset": -1, "filtered_bytes": 0}  # the last two: FETCH v1
        try:
            plog, leader, _config = node.leader_log(p["topic"], p["partition"])
            epoch = p["current_leader_epoch"]
            if epoch != apis.ANY_LEADER_EPOCH and epoch != leader.epoch:
                if epoch < leader.epoch:
                    raise errors.FencedLeaderEpochError(f"epoch {epoch} < {leader.epoch}")
                raise errors.UnknownLeaderEpochError(f"epoch {epoch} > {leader.epoch}")
            hw = plog.high_watermark
            result["high_watermark"] = hw
            result["log_start_offset"] = plog.log_start_offset
            result["log_end_offset"] = plog.log_end_offset
            limit = read_limit(body["replica_id"], hw, plog.log_end_offset, p["fetch_offset"])
            if limit is None:
                batches: list[bytes] = []
            else:
                room = min(p["partition_bytes_max"], budget - total) if total < budget else 0
                # The first batch is read whatever its size (as Kafka's KIP-74), unless the
                # client may read nothing at all now.
                may_read = room > 0 or (total == 0 and budget > 0)
                tag_filter = body.get("parsed_tag_filter")
                if tag_filter is not None and may_read:
                    batches, result["next_fetch_offset"], result["filtered_bytes"] = read_filtered(
                        plog.read, limit, p["fetch_offset"], max(room, 1), tag_filter)
                else:
                    batches = plog.read(p["fetch_offset"], max(room, 1), limit) if may_read else []
            result["batch_count"] = len(batches)
            frames.extend(batches)
            total += sum(len(b) for b in batches)
        except errors.FabricError as exc:
            result["error"] = exc.code
            any_error = True
        results.append(result)
    if not fetch_ready(final=final, any_error=any_error, bytes_found=total, min_bytes=body["min_bytes"]):
        return False
    if not frames:
        node.send_response(fetch.envelope, fetch.header, {"partitions": results})
        return True
    frames, tracker = node.reply_budget.tracked(frames)
    if node.send_response(fetch.envelope, fetch.header, {"partitions": results}, frames):
        node.reply_budget.sent(identity, tracker, total)
    return True




def wake_parked(node: NodeState, touched: set[TopicPartition]) -> None:
    """A change listener: retry the parked fetches that read a partition that changed."""
    if not node.parked or not touched:
        return
    still: list[ParkedFetch] = []
    for fetch in node.parked:
        if fetch.keys & touched and try_answer(node, fetch, final=False):
            continue
        still.append(fetch)
    node.parked = still


def expire_parked(node: NodeState, now: float) -> None:
    """A loop duty: answer, with what there is, every fetch whose wait is over."""
    if not node.parked:
        return
    still: list[ParkedFetch] = []
    for fetch in node.parked:
        if fetch.deadline <= now:
            try_answer(node, fetch, final=True)
        else:
            still.append(fetch)
    node.parked = still


def next_deadline(node: NodeState) -> float | None:
    return min((fetch.deadline for fetch in node.parked), default=None)

"""PRODUCE: validation, group commit, pending acks, the high watermark they wait for.

A produce request is staged (``stage``) into the loop turn's one RocksDB WriteBatch; the
server writes the batch once for every request of the turn, then calls ``commit`` with
all of them: publish the batches to followers, move the high watermarks, answer acks=0/1
producers and park acks=all producers (``PendingProduce``) until the high watermark
passes their batches, their ``timeout_ms`` ends, or this node stops leading.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fabric import errors
from fabric.limits import PRODUCE_DECOMPRESSED_BYTES_MAX, PRODUCE_TIMEOUT_MS_MAX
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol import queues as qp
from fabric.protocol.header import Header
from nodes import drain, queue_coordinator, strict_order
from nodes import leader as leader_side
from nodes.log import IndexEntry
from nodes.producer_state import DUPLICATE
from nodes.state import Envelope, NodeState, TopicPartition

log = logging.getLogger("fabric.node")

# How far back (in batches, newest first) a retry's batch is looked for when it is older
# than the producer's last few: a retry comes within its delivery timeout, so it is near
# the end; the bound keeps a forged old sequence from costing a scan of the whole index.
DUPLICATE_SEARCH_BATCHES_MAX = 100_000


@dataclass
class ProduceOutcome:
    results: list[dict[str, Any]] = field(default_factory=list)
    appended: list[tuple[TopicPartition, bytes]] = field(default_factory=list)  # to publish
    waits: dict[int, tuple[TopicPartition, int]] = field(default_factory=dict)  # result index -> (tp, end offset)
    parked: bool = False  # waits for a sequencer grant (nodes/strict_grants.py): staged later


@dataclass
class PendingProduce:
    """An acks=all produce waiting for the high watermark to pass its batches."""

    envelope: Envelope
    header: Header
    results: list[dict[str, Any]]
    waits: dict[int, tuple[TopicPartition, int]]  # result index -> (tp, offset the HW must reach)
    deadline: float


def stage(node: NodeState, wb: Any, envelope: Envelope, request: apis.Message,
          ids: strict_order.RequestIds | None = None) -> ProduceOutcome:
    """Validate and stage every batch of one request (a request-level error raises). A
    request with strict-order batches is parked for its grant first, and staged again with
    ``ids`` when the grant (or its error) is back (``stage_granted``)."""
    body = request.body
    acks = body["acks"]
    if acks not in (0, 1, -1):
        raise errors.InvalidRequestError(f"acks={acks} must be 0, 1 or -1 (all)")
    if not 0 <= body["timeout_ms"] <= PRODUCE_TIMEOUT_MS_MAX:
        raise errors.InvalidRequestError(f"timeout_ms={body['timeout_ms']} outside [0, {PRODUCE_TIMEOUT_MS_MAX}]")
    now_ms = int(time.time() * 1000)
    internal_refused = request.header.api_version < apis.INTERNAL_VERSION
    # Queue headers are checked unless a node wrote them (its dead letters keep whatever the
    # source topic's producers wrote, as any topic may be read in queue mode): version 1,
    # and on a secure cluster only from a node or super key.
    queue_headers_checked = internal_refused or (node.authz is not None and not node.authz.caller_may_replicate())
    outcome = ProduceOutcome()
    if ids is None:
        ids = strict_order.RequestIds(node, None, None)
        ids_needed = strict_order.records_to_stamp(node, request)
        if ids_needed:
            asker = strict_order.for_node(node).asker
            assert asker is not None  # made with the order
            try:
                asker.park(envelope, request, ids_needed, node.authz.principal if node.authz is not None else "",
                           time.monotonic())
                outcome.parked = True
                return outcome
            except errors.FabricError as exc:  # answered now: duplicates from the log, new batches refused
                ids.failure = exc
    results = outcome.results
    decompressed_bytes = 0  # lz4 output of this request's batches so far (PRODUCE_DECOMPRESSED_BYTES_MAX)
    for entry, frame in zip(body["entries"], request.batches, strict=True):
        topic, partition = entry["topic"], entry["partition"]
        result = {"topic": topic, "partition": partition, "error": 0, "base_offset": -1, "log_start_offset": -1, "message": ""}
        try:
            if internal_refused and apis.is_internal_topic(topic):
                raise errors.InvalidTopicError(
                    f"topic {topic!r} is internal: only Fabric's nodes write it (names starting with "
                    f"{apis.INTERNAL_TOPIC_PREFIX!r} are reserved)")
            plog, leader, config = node.leader_log(topic, partition)
            drain.check_writable(node, topic, partition)
            node.check_write_allowed(acks)
            header = batch_format.validate(frame, config.message_bytes_max, contents=False)
            batch_format.check_produced(header)
            if header.codec != batch_format.CODEC_NONE:
                decompressed_bytes = charge_decompression(decompressed_bytes, header.records_bytes)
                node.turn_decompressed_bytes += header.records_bytes
            records = batch_format.records_section(frame, header)
            max_timestamp = batch_format.check_records(header, records)
            # A client's queue options are record headers: checked here, not dropped at
            # delivery (queue_headers_checked above says whose are).
            if config.queue and queue_headers_checked:
                for headers in batch_format.record_headers(header, records):
                    if headers:
                        qp.check_sent_headers(headers, now_ms)
            # Every topic: only a strict-order leader stamps global IDs (readers of a plain
            # topic would otherwise see IDs nobody issued).
            strict_order.check_producer_batch(header, topic, partition)
            if acks == -1 and len(leader.isr) < config.min_insync:
                raise errors.NotEnoughReplicasError(
                    f"{topic}/{partition}: {len(leader.isr)} in-sync replicas {sorted(leader.isr)} < min_insync={config.min_insync}"
                )
            verdict, original_offset = plog.producers.check(
                header.producer_id, header.producer_epoch, header.base_sequence, header.record_count
            )
            if verdict == DUPLICATE:
                # A retry of a batch we already have: answer as the first time, write
                # nothing (and for acks=all, wait until that first copy is replicated).
                if original_offset < 0:
                    original_offset = stored_offset(plog.entries, header)
                result["base_offset"] = original_offset
                end = original_offset + header.record_count if original_offset >= 0 else plog.log_end_offset
            else:
                if config.queue and (config.max_messages or config.max_bytes):
                    queue_coordinator.check_room(node, (topic, partition), header.record_count, records)
                # Stamped only here, after the duplicate check: a retry is never stamped twice.
                # A strict-order batch takes its global ID (and a new CRC) in a copy first.
                if config.strict_order:
                    data: Any = bytearray(frame)
                    global_id = ids.stamp((topic, partition), leader.epoch, data, header.record_count)
                else:
                    data = frame
                if max_timestamp != header.max_timestamp:
                    # The producer's claim is not its records' largest timestamp: store the
                    # truth (new CRC), as Kafka's broker does, since time look-ups and time
                    # retention read only this field.
                    data = batch_format.with_max_timestamp(data, max_timestamp)
                    header = header._replace(max_timestamp=max_timestamp)
                result["base_offset"], stored = plog.append(wb, data, header, leader.epoch, now_ms)
                if config.strict_order:
                    ids.appended((topic, partition), leader.epoch, global_id, header.record_count)
                outcome.appended.append(((topic, partition), stored))
                end = result["base_offset"] + header.record_count
            if acks == -1:
                outcome.waits[len(results)] = ((topic, partition), end)
            result["log_start_offset"] = plog.log_start_offset
        except errors.FabricError as exc:
            result["error"] = exc.code
            result["message"] = exc.message
        results.append(result)
    return outcome


def stored_offset(entries: list[IndexEntry], header: batch_format.BatchHeader) -> int:
    """The base offset of the stored batch a retry repeats, found in the index when it is
    older than the last RECENT_BATCHES_PER_PRODUCER batches of its producer; -1 if it is
    not there whole (retention deleted it, or the retry overlaps stored batches).

    The producer keeps at most 5 batches of a partition in flight, but a leader answers a
    request only when every partition in it is done: a batch in a request held up by
    another partition can see any number of later batches of its partition answered, and
    its retry on a new leader then came back with base_offset -1, which the SDK resolves
    as an acks=all write at offset -1 (seen in a combined-fault soak)."""
    for searched, entry in enumerate(reversed(entries)):
        if searched >= DUPLICATE_SEARCH_BATCHES_MAX:
            break
        if (entry.producer_id == header.producer_id and entry.producer_epoch == header.producer_epoch
                and entry.base_sequence == header.base_sequence):
            return entry.base_offset if entry.record_count == header.record_count else -1
    return -1


def charge_decompression(spent_bytes: int, records_bytes: int) -> int:
    """The request's decompressed bytes after one more compressed batch, or THROTTLED if
    that batch would pass PRODUCE_DECOMPRESSED_BYTES_MAX: checked from the header's
    records_bytes (the lz4 frame's size claim, already checked), before decompressing.

    Retriable, with nothing written: the batches are sound, the request only carried too
    many of them, and a producer resends a refused batch. The first compressed batch of a
    request is always taken (records_bytes <= 64 MiB), so every request makes progress and
    a batch resent alone always gets through; a partition's batches are refused from some
    point of the request on, never with a gap in its sequences. The Python producer sends
    at most ~1 MiB of records per request (a larger batch alone) and never meets it; the C
    client's 64 batches meet it only with batch_bytes_max above 2 MiB."""
    if spent_bytes and spent_bytes + records_bytes > PRODUCE_DECOMPRESSED_BYTES_MAX:
        raise errors.ThrottledError(
            f"the request's compressed batches decompress to more than PRODUCE_DECOMPRESSED_BYTES_MAX="
            f"{PRODUCE_DECOMPRESSED_BYTES_MAX} bytes; this batch was not written, send it again in another request")
    return spent_bytes + records_bytes


def commit(node: NodeState, staged: list[tuple[Envelope, apis.Message, ProduceOutcome]]) -> None:
    """After the turn's write: publish the batches, then answer or park each producer."""
    staged = [item for item in staged if not item[2].parked]
    touched: set[TopicPartition] = set()
    for _envelope, _request, outcome in staged:
        for tp, data in outcome.appended:
            touched.add(tp)
            leader_side.publish(node, tp, data)
    for tp in touched:
        leader_side.update_high_watermark(node, tp)
    now = time.monotonic()
    for envelope, request, outcome in staged:
        acks = request.body["acks"]
        if acks == 0:
            continue
        if acks == 1:
            withhold_if_lease_ended(node, outcome.results)
        if acks == 1 or not outcome.waits:
            node.send_response(envelope, request.header, {"results": outcome.results})
            continue
        deadline = now + request.body["timeout_ms"] / 1000.0
        node.pending.append(PendingProduce(envelope, request.header, outcome.results, outcome.waits, deadline))
        touched.update(tp for tp, _end in outcome.waits.values())
    node.partitions_changed(touched)


def stage_granted(node: NodeState, now: float) -> None:
    """A loop duty: stage the parked produce requests whose sequencer grant is back, oldest
    first, in one write, then answer or park them as ``commit`` does."""
    asker = node.strict_order.asker if node.strict_order is not None else None
    ready = asker.take_ready(now) if asker is not None else []
    if not ready:
        return
    wb = node.store.new_write_batch()
    staged: list[tuple[Envelope, apis.Message, ProduceOutcome]] = []
    for parked, answer in ready:
        if node.authz is not None:
            node.authz.principal = parked.principal  # as when it was admitted
        try:
            ids = strict_order.RequestIds(node, answer.pool, answer.failure)
            staged.append((parked.envelope, parked.request, stage(node, wb, parked.envelope, parked.request, ids)))
        except errors.FabricError as exc:
            node.send_error(parked.envelope, parked.request.header, exc)
        except Exception as exc:  # a bug: this request fails, the node keeps serving
            log.exception("staging a produce request after its grant failed")
            node.send_error(parked.envelope, parked.request.header, errors.UnknownServerError(f"{type(exc).__name__}: {exc}"))
    node.write_staged(wb, staged)
    commit(node, staged)


def next_grant_deadline(node: NodeState) -> float | None:
    asker = node.strict_order.asker if node.strict_order is not None else None
    return asker.next_deadline() if asker is not None else None


def withhold_if_lease_ended(node: NodeState, results: list[dict[str, Any]]) -> None:
    """Check the lease again right before an acks=1 answer, not only when the request was
    staged: a process stopped between the two wakes with the turn half done, and must not
    acknowledge what a new leader may not have (docs/DESIGN.md, Replication). The write
    stays in the log unacknowledged; the producer's retry is deduplicated if we still lead."""
    try:
        node.check_write_allowed(1)
    except errors.NodeNotReadyError as exc:
        for result in results:
            if result["error"] == 0:
                result["error"], result["message"] = exc.code, exc.message


def complete_pending(node: NodeState, tps: set[TopicPartition]) -> None:
    """A change listener: answer the acks=all produces the high watermark has passed.

    Also called when this node stops leading a partition: those waits fail with
    NOT_LEADER (the write may or may not survive; the producer retries idempotently).
    """
    if not node.pending or not tps:
        return
    still: list[PendingProduce] = []
    for pending in node.pending:
        for index, (tp, required) in list(pending.waits.items()):
            if tp not in tps:
                continue
            leader = node.leaders.get(tp)
            result = pending.results[index]
            if leader is None:
                result["error"] = errors.NotLeaderError.code
                result["message"] = f"node {node.node_id} lost leadership of {tp[0]}/{tp[1]} before the write was replicated"
            elif node.logs[tp].high_watermark >= required:
                config = node.configs[tp[0]]
                if len(leader.isr) < config.min_insync:
                    result["error"] = errors.NotEnoughReplicasAfterAppendError.code
                    result["message"] = f"written, but only {len(leader.isr)} in-sync replicas remain"
            else:
                continue
            del pending.waits[index]
        if pending.waits:
            still.append(pending)
        else:
            node.send_response(pending.envelope, pending.header, {"results": pending.results})
    node.pending = still


def expire_pending(node: NodeState, now: float) -> None:
    """A loop duty: answer REQUEST_TIMED_OUT for the waits ``timeout_ms`` has ended."""
    if not node.pending:
        return
    still: list[PendingProduce] = []
    for pending in node.pending:
        if pending.deadline > now:
            still.append(pending)
            continue
        for index, (tp, _required) in pending.waits.items():
            pending.results[index]["error"] = errors.RequestTimedOutError.code
            pending.results[index]["message"] = f"not replicated to the ISR of {tp[0]}/{tp[1]} within timeout_ms"
        node.send_response(pending.envelope, pending.header, {"results": pending.results})
    node.pending = still


def next_deadline(node: NodeState) -> float | None:
    return min((pending.deadline for pending in node.pending), default=None)

"""A partition leader's strict-order duties (docs/DESIGN.md, "Strict-order topics").

* Refuse forged IDs: producers send ``global_id_base = -1``; only the leader stamps it.
* Stamp: after the idempotence check (a retried batch is answered from the log and never
  stamped twice), the batches of one produce request share one sequencer grant, split
  in request order. The leader refuses a grant from an older sequencer epoch than one
  it has seen, and one at or below its partition's last ID, so IDs rise along every
  log, across leader and sequencer failovers.
* Tick: a strict-order partition that had no append for ``strict_order_tick_ms`` gets a
  one-record control batch with a fresh ID. Ordered readers need every partition's last
  ID to move (their watermark is the minimum); a tick moves an idle one. A deposed
  leader cannot commit a tick (no in-sync replica acknowledges it), so a stale tick
  never reaches a reader.

The decisions are here and unit tested without sockets; the node's produce path and
loop call them. The sequencer is reached through ``grant_source`` (in the node,
``fabric.sequencer_client.SequencerClient.allocate`` with a short timeout).
"""

from __future__ import annotations

import functools
import logging
import struct
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from fabric import errors
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol.sequencer import ID_KIND_RECORDS, SEQUENCER_GRANT_IDS_MAX, Grant
from fabric.sequencer_client import SequencerClient
from nodes.strict_grants import GrantAsker

if TYPE_CHECKING:
    from nodes.state import NodeState

log = logging.getLogger("fabric.node")

STRICT_ORDER_TICK_MS_DEFAULT = 50
# How long a produce request may wait for its grant before it is refused with the
# retriable SEQUENCER_NOT_AVAILABLE (the producer retries). Short, because the node's loop
# waits with it; a sequencer failover is absorbed by producer retries, not by this wait.
GRANT_TIMEOUT_MS_DEFAULT = 500
TICK_CHECK_INTERVAL_S = 0.01  # how often the loop looks for idle strict-order partitions
GRANT_REQUEST_TIMEOUT_MS = 250  # one try at one sequencer instance, then ZooKeeper again
# After a failed grant, fail fast for this long instead of holding the loop again: the
# producers' retries (100 ms backoff) find the sequencer when it is back.
GRANT_RETRY_BACKOFF_S = 0.2
NO_GLOBAL_ID = -1

TopicPartition = tuple[str, int]


def check_producer_batch(header: batch_format.BatchHeader, topic: str, partition: int) -> None:
    """A batch a producer sent, to any topic: it must not carry IDs (a strict-order leader
    stamps them; the control bit is refused before, by ``batch_format.check_produced``)."""
    if header.global_id_base != NO_GLOBAL_ID:
        raise errors.InvalidGlobalIdError(
            f"{topic}/{partition}: batch carries global_id_base={header.global_id_base}; producers send -1 "
            "and the partition leader of a strict-order topic stamps IDs from the sequencer")


def last_global_id(last_batch: bytes | None) -> int:
    """The last ID in a partition, from its last batch (0 for an empty log or none)."""
    if last_batch is None:
        return 0
    header = batch_format.read_header(last_batch)
    if header.global_id_base < 0:
        return 0
    return header.global_id_base + header.record_count - 1


class GrantPool:
    """One grant, handed out in order to the batches of the produce requests it was asked for."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.next_id = grant.first_id

    @property
    def remaining(self) -> int:
        return self.grant.end_id - self.next_id

    def take(self, count: int) -> int:
        if self.next_id + count > self.grant.end_id:  # more records than one grant may hold
            raise errors.SequencerNotAvailableError(
                f"grant {self.grant} cannot cover {count} more IDs from {self.next_id}; retry")
        base = self.next_id
        self.next_id += count
        return base


def make_tick(now_ms: int) -> bytearray:
    """A one-record control batch (no key, no value); its ID is stamped like any batch's."""
    buf = bytearray(batch_format.encode_batch([now_ms], [None], [None], codec=batch_format.CODEC_NONE))
    buf[21] |= batch_format.ATTRIBUTE_CONTROL
    struct.pack_into("<I", buf, 16, batch_format.compute_crc(buf))
    return buf


class StrictOrder:
    """Per node: the last ID of each strict-order partition it leads, the newest sequencer
    epoch it has seen, and when each partition last had an append (for ticks)."""

    def __init__(self, grant_source: Callable[[int, int], Grant], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.grant_source = grant_source  # (count, kind) -> Grant
        self.clock = clock
        self.highest_epoch = 0
        # One past the highest ID the sequencer granted for records, as last heard: an idle
        # partition whose last ID is below records_end - 1 holds readers back and ticks.
        self.records_end = 0
        self.asked_records_end_s = float("-inf")
        # (leader epoch, last ID): a new leader epoch re-reads the last ID from the log.
        self.last_id: dict[TopicPartition, tuple[int, int]] = {}
        self.last_append_s: dict[TopicPartition, float] = {}
        self.failed_at = float("-inf")
        self.close: Callable[[], None] = lambda: None
        self.asker: GrantAsker | None = None  # the node's: asks grants off its loop (nodes/strict_grants.py)

    def forget(self, tp: TopicPartition) -> None:
        """Leadership changed: the last ID is read from the log again when next needed."""
        self.last_id.pop(tp, None)
        self.last_append_s.pop(tp, None)

    def grant(self, count: int, kind: int = ID_KIND_RECORDS) -> GrantPool:
        """One grant for ``count`` IDs, asked here and now (raises SequencerNotAvailableError,
        retriable). The node asks on its grant thread instead (nodes/strict_grants.py) and
        calls ``check_backoff``, ``failed`` and ``accept`` on its loop."""
        self.check_backoff()
        try:
            grant = self.grant_source(count, kind)
        except errors.FabricError:
            self.failed()
            raise
        return self.accept(grant, count)

    def check_backoff(self) -> None:
        if self.clock() - self.failed_at < GRANT_RETRY_BACKOFF_S:
            raise errors.SequencerNotAvailableError("the sequencer did not answer a moment ago; retry")

    def failed(self) -> None:
        self.failed_at = self.clock()

    def accept(self, grant: Grant, count: int) -> GrantPool:
        """Take ``grant``, asked for ``count`` IDs, if it may be used: not from an older
        sequencer epoch, not short."""
        if grant.epoch < self.highest_epoch:
            raise errors.StaleSequencerEpochError(
                f"grant {grant} comes from sequencer epoch {grant.epoch}; this node has seen {self.highest_epoch}")
        if grant.id_count < count:
            raise errors.SequencerNotAvailableError(f"grant {grant} is short of the {count} IDs asked for")
        if grant.epoch > self.highest_epoch:
            self.records_end = grant.records_end  # a new epoch's view replaces the old one's
        self.highest_epoch = grant.epoch
        self.records_end = max(self.records_end, grant.records_end)
        return GrantPool(grant)

    def known_last_id(self, tp: TopicPartition, leader_epoch: int, read_last_batch: Callable[[], bytes | None]) -> int:
        known = self.last_id.get(tp)
        if known is None or known[0] != leader_epoch:
            known = (leader_epoch, last_global_id(read_last_batch()))
            self.last_id[tp] = known
        return known[1]

    def stamp(self, tp: TopicPartition, leader_epoch: int, buf: bytearray, record_count: int, pool: GrantPool,
              read_last_batch: Callable[[], bytes | None]) -> int:
        """Stamp ``buf`` with the next IDs of ``pool``; returns its first ID. Call
        ``appended`` once the batch is staged."""
        last = self.known_last_id(tp, leader_epoch, read_last_batch)
        base = pool.take(record_count)
        if base <= last:
            raise errors.GlobalIdRegressionError(
                f"{tp[0]}/{tp[1]}: grant starts at {base}, not above the partition's last ID {last}")
        batch_format.stamp_global_id(buf, base)
        return base

    def appended(self, tp: TopicPartition, leader_epoch: int, base_id: int, record_count: int, now_s: float) -> None:
        self.last_id[tp] = (leader_epoch, base_id + record_count - 1)
        self.last_append_s[tp] = now_s

    def idle(self, led: Iterable[tuple[TopicPartition, float]], now_s: float) -> list[TopicPartition]:
        """Of the led strict-order partitions (with their tick interval in seconds), those
        without an append for a tick interval. A partition just taken over counts as idle
        at once: its readers have waited for a leader already."""
        return [tp for tp, interval_s in led if now_s - self.last_append_s.get(tp, float("-inf")) >= interval_s]

    def needs_tick(self, tp: TopicPartition) -> bool:
        """Readers wait on this partition only if a record elsewhere has a higher ID than its
        last one. (A tick for every idle interval regardless would fill an idle topic's log
        with millions of ticks a week.)"""
        known = self.last_id.get(tp)
        return known is None or known[1] < self.records_end - 1


# -- the node's side: called by nodes/produce.py and as a loop duty (nodes/server.py) ------------
def for_node(node: NodeState) -> StrictOrder:
    """The node's StrictOrder, made on first use (a node without strict-order topics never
    talks to a sequencer)."""
    existing: StrictOrder | None = node.strict_order
    if existing is not None:
        return existing
    client = SequencerClient(node.zk, request_timeout_ms=GRANT_REQUEST_TIMEOUT_MS,
                             security=node.authz.client if node.authz is not None else None)
    made = StrictOrder(lambda count, kind: client.allocate(count, timeout_ms=GRANT_TIMEOUT_MS_DEFAULT, kind=kind))
    # The client is used on the asker's thread only; closed after that thread ends.
    made.asker = GrantAsker(made, node.wake)

    def close_both() -> None:
        parked = made.asker.close() if made.asker is not None else []
        client.close()
        for p in parked:  # the node is stopping: the producers retry elsewhere
            node.send_error(p.envelope, p.request.header, errors.NodeNotReadyError(
                f"node {node.node_id} stopped while the request waited for the sequencer"))

    made.close = close_both
    node.strict_order = made
    return made


def close(node: NodeState) -> None:
    if node.strict_order is not None:
        node.strict_order.close()
        node.strict_order = None


def read_last_batch(node: NodeState, tp: TopicPartition) -> bytes | None:
    plog = node.logs[tp]
    if not plog.entries:
        return None
    batches = plog.read(plog.entries[-1].base_offset, 1, plog.log_end_offset)
    return bytes(batches[-1]) if batches else None


class RequestIds:
    """The IDs of one produce request: the grant asked for all its strict-order records
    before it was staged (nodes/strict_grants.py), or the error that grant ended in."""

    def __init__(self, node: NodeState, pool: GrantPool | None, failure: errors.FabricError | None) -> None:
        self.node = node
        self.pool = pool
        self.failure = failure

    def stamp(self, tp: TopicPartition, leader_epoch: int, buf: bytearray, record_count: int) -> int:
        if self.pool is None:
            raise self.failure or errors.SequencerNotAvailableError("no grant was asked for this request")
        return for_node(self.node).stamp(tp, leader_epoch, buf, record_count, self.pool,
                                         lambda: read_last_batch(self.node, tp))

    def appended(self, tp: TopicPartition, leader_epoch: int, base_id: int, record_count: int) -> None:
        for_node(self.node).appended(tp, leader_epoch, base_id, record_count, time.monotonic())


def records_to_stamp(node: NodeState, request: apis.Message) -> int:
    """How many IDs a produce request's strict-order batches need (0: none of its topics is
    strict-order). Duplicates count too: which batches are retries is decided when staging."""
    total, strict = 0, False
    for entry, frame in zip(request.body["entries"], request.batches, strict=True):
        config = node.configs.get(entry["topic"])
        if config is not None and config.strict_order:
            strict = True
            try:
                total += max(0, batch_format.read_header(frame).record_count)
            except errors.FabricError:
                continue  # refused by validation anyway
    return max(1, min(total, SEQUENCER_GRANT_IDS_MAX)) if strict else 0


def tick(node: NodeState, now: float) -> None:
    """A loop duty: append a tick to every led strict-order partition that is idle for its
    ``strict_order_tick_ms`` and below the sequencer's ``records_end``, with one grant for
    all of them, one write, then publish. Asks the sequencer for ``records_end`` at most
    once a tick interval while idle partitions wait. Grants are asked on the asker's thread
    (nodes/strict_grants.py) and used on a later tick: this never waits for one."""
    # Topics first: every 10 ms, a walk of every led partition was 6 % of an idle node at
    # 2,000 partitions, most clusters having no strict-order topic at all.
    tick_s = {name: config.strict_order_tick_ms / 1000.0 for name, config in node.configs.items() if config.strict_order}
    if not tick_s:
        return
    led = [(tp, tick_s[tp[0]]) for tp in node.leaders if tp[0] in tick_s]
    if not led or not node.session_ok():
        return
    order = for_node(node)
    asker = order.asker
    assert asker is not None  # made with the order (for_node)
    answer = asker.take_ticks_answer(now)  # a records_end answer has moved records_end already
    idle = order.idle(led, now)
    if not idle:
        return
    for tp in idle:
        order.known_last_id(tp, node.leaders[tp].epoch, functools.partial(read_last_batch, node, tp))
    due = [tp for tp in idle if order.needs_tick(tp)]
    if answer is not None and answer.failure is not None:
        log.debug("no ticks this turn: %s", answer.failure)
        return
    pool = answer.pool if answer is not None else None
    if pool is None or not pool.remaining:  # none yet, or only records_end: ask, unless asked
        if asker.ticks_asked:
            pass
        elif due:
            asker.ask_ticks(len(due), now)
        elif now - order.asked_records_end_s >= min(interval for _tp, interval in led):
            order.asked_records_end_s = now
            asker.ask_records_end(now)  # no IDs: only records_end, to see whether anyone waits on us
        return
    due = due[:pool.remaining]  # the rest on a later tick; IDs left unused are a gap, as allowed
    if not due:
        return
    from nodes import leader as leader_side  # the leader's publish/HW rules live there

    wb = node.store.new_write_batch()
    now_ms = int(time.time() * 1000)
    staged: list[tuple[TopicPartition, int, bytes]] = []
    for tp in due:
        leader = node.leaders[tp]
        buf = make_tick(now_ms)
        header = batch_format.read_header(buf)
        try:
            base_id = order.stamp(tp, leader.epoch, buf, 1, pool, functools.partial(read_last_batch, node, tp))
        except errors.FabricError as exc:  # a record took a newer grant since this one was asked
            log.debug("tick of %s/%d refused: %s", tp[0], tp[1], exc)
            continue
        staged.append((tp, base_id, node.logs[tp].append(wb, buf, header, leader.epoch, now_ms)[1]))
    if not staged:
        return
    node.store.write(wb)
    for tp, base_id, data in staged:
        order.appended(tp, node.leaders[tp].epoch, base_id, 1, now)
        leader_side.publish(node, tp, data)
        leader_side.update_high_watermark(node, tp)
    node.partitions_changed({tp for tp, _b, _d in staged})

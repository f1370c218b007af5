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

import struct
from collections.abc import Callable, Iterable

from fabric import errors
from fabric.protocol import batch as batch_format
from fabric.protocol.sequencer import Grant

STRICT_ORDER_TICK_MS_DEFAULT = 50
# How long a produce request may wait for its grant before it is refused with the
# retriable SEQUENCER_NOT_AVAILABLE (the producer retries). Short, because the node's loop
# waits with it; a sequencer failover is absorbed by producer retries, not by this wait.
GRANT_TIMEOUT_MS_DEFAULT = 500
NO_GLOBAL_ID = -1

TopicPartition = tuple[str, int]


def check_producer_batch(header: batch_format.BatchHeader, topic: str, partition: int) -> None:
    """A batch a producer sent to a strict-order partition: it must not carry IDs."""
    if header.global_id_base != NO_GLOBAL_ID:
        raise errors.InvalidGlobalIdError(
            f"{topic}/{partition}: batch carries global_id_base={header.global_id_base}; producers send -1 "
            "and the partition leader stamps IDs from the sequencer")
    if header.attributes & batch_format.ATTRIBUTE_CONTROL:
        raise errors.InvalidRequestError(f"{topic}/{partition}: control batches are written by leaders only")


def last_global_id(last_batch: bytes | None) -> int:
    """The last ID in a partition, from its last batch (0 for an empty log or none)."""
    if last_batch is None:
        return 0
    header = batch_format.read_header(last_batch)
    if header.global_id_base < 0:
        return 0
    return header.global_id_base + header.record_count - 1


class GrantPool:
    """One grant, handed out in order to the batches of one produce request."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.next_id = grant.first_id

    def take(self, count: int) -> int:
        if self.next_id + count > self.grant.end_id:
            raise RuntimeError(f"grant {self.grant} cannot cover {count} more IDs from {self.next_id}")
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

    def __init__(self, grant_source: Callable[[int], Grant], *, tick_interval_ms: int = STRICT_ORDER_TICK_MS_DEFAULT) -> None:
        self.grant_source = grant_source
        self.tick_interval_s = tick_interval_ms / 1000.0
        self.highest_epoch = 0
        self.last_id: dict[TopicPartition, int] = {}
        self.last_append_s: dict[TopicPartition, float] = {}

    def forget(self, tp: TopicPartition) -> None:
        """Leadership changed: the last ID is read from the log again when next needed."""
        self.last_id.pop(tp, None)
        self.last_append_s.pop(tp, None)

    def grant(self, count: int) -> GrantPool:
        """One grant for ``count`` IDs (raises SequencerNotAvailableError, retriable)."""
        grant = self.grant_source(count)
        if grant.epoch < self.highest_epoch:
            raise errors.StaleSequencerEpochError(
                f"grant {grant} comes from sequencer epoch {grant.epoch}; this node has seen {self.highest_epoch}")
        if grant.id_count < count:
            raise errors.SequencerNotAvailableError(f"grant {grant} is short of the {count} IDs asked for")
        self.highest_epoch = grant.epoch
        return GrantPool(grant)

    def stamp(self, tp: TopicPartition, buf: bytearray, record_count: int, pool: GrantPool,
              read_last_batch: Callable[[], bytes | None]) -> int:
        """Stamp ``buf`` with the next IDs of ``pool``; returns its first ID. Call
        ``appended`` once the batch is staged."""
        last = self.last_id.get(tp)
        if last is None:
            last = last_global_id(read_last_batch())
            self.last_id[tp] = last
        base = pool.take(record_count)
        if base <= last:
            raise errors.GlobalIdRegressionError(
                f"{tp[0]}/{tp[1]}: grant starts at {base}, not above the partition's last ID {last}")
        batch_format.stamp_global_id(buf, base)
        return base

    def appended(self, tp: TopicPartition, base_id: int, record_count: int, now_s: float) -> None:
        self.last_id[tp] = base_id + record_count - 1
        self.last_append_s[tp] = now_s

    def led(self, tp: TopicPartition, now_s: float) -> None:
        """A strict-order partition this node leads: tick it from now on."""
        self.last_append_s.setdefault(tp, now_s - self.tick_interval_s)

    def ticks_due(self, led: Iterable[TopicPartition], now_s: float) -> list[TopicPartition]:
        """The led strict-order partitions without an append for a tick interval."""
        return [tp for tp in led if now_s - self.last_append_s.get(tp, float("-inf")) >= self.tick_interval_s]

"""Idempotent-producer state of one partition: pure logic, no I/O.

Per producer id the partition remembers the epoch, the last sequence appended and the
last few batches' (first sequence, last sequence, base offset), so a retried batch is
answered with its original offset instead of being written twice. The state is rebuilt
from the partition's index at startup and after truncation (every batch's producer id,
epoch and base sequence are in the index), so it survives restarts and, because
followers store the leader's bytes, failovers too.

The rules, checked in ``check`` (one place decides):

* producer id -1: not idempotent, always appended.
* unknown producer id: appended whatever the sequence (we may have forgotten it, e.g.
  after retention deleted all its batches; refusing would wedge the producer).
* epoch below the stored one: INVALID_PRODUCER_EPOCH (a newer producer fenced it).
* epoch above the stored one: the new epoch must start at sequence 0.
* same epoch: last sequence <= stored last → duplicate (answered, not written);
  first sequence == stored last + 1 → appended; anything else → OUT_OF_ORDER_SEQUENCE.

Sequences wrap from 2^31 - 1 to 0, as Kafka's: record ``i`` of a batch has sequence
``(base_sequence + i) mod 2^31``, so a producer never runs out of them (at a million
records a second, one partition passes 2^31 in 36 minutes). "At or below" is then modular:
a sequence is below another when it is less than 2^30 behind it. The batch header's
producer fields are range-checked before (``batch_format.check_produced``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from fabric.errors import InvalidProducerEpochError, OutOfOrderSequenceError

SEQUENCE_MODULUS = 1 << 31  # sequences are i32 >= 0: after 2^31 - 1 comes 0
RECENT_BATCHES_PER_PRODUCER = 5  # duplicates within this window get their original offset
PRODUCERS_PER_PARTITION_MAX = 10_000  # least recently used producer ids are forgotten first
# A producer id that wrote nothing to a partition for this long is forgotten there. Kafka
# forgets a producer id after a day (producer.id.expiration.ms) and a transactional id after
# seven (transactional.id.expiration.ms); the Spark sink's explicit ids play the
# transactional id's part (a query restarted days later re-runs its last batch, which must
# still be recognised: docs/SPARK.md), so seven days. Every short-lived producer takes a new id, so under
# client churn the count bound alone let each partition replica fill up to its 10,000 ids
# (about 1 KB each then; a soak of 3,000 producers grew every node by 0.75 MB per 500) and
# keep them for good: with many partitions, gigabytes. A write of a forgotten id is appended
# as any unknown one is (a retry of it more than seven days late is not caught).
# Ids rebuilt from the index at startup count as written then.
PRODUCER_ID_EXPIRATION_MS = 7 * 86_400_000

APPEND = "append"
DUPLICATE = "duplicate"


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_sequence: int
    # (first sequence, last sequence, base offset), oldest first, at most
    # RECENT_BATCHES_PER_PRODUCER (a list: an empty deque alone took 624 bytes)
    recent: list[tuple[int, int, int]] = field(default_factory=list)
    written_s: float = 0.0  # clock of the last batch recorded


class ProducerStates:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 expiration_ms: int = PRODUCER_ID_EXPIRATION_MS) -> None:
        # Least recently written first: the expired and the evicted are always at the front.
        self.producers: OrderedDict[int, ProducerEntry] = OrderedDict()
        self._clock = clock
        self._expiration_s = expiration_ms / 1000

    def check(self, producer_id: int, epoch: int, base_sequence: int, record_count: int) -> tuple[str, int]:
        """(APPEND, -1) or (DUPLICATE, original base offset or -1); raises on a bad sequence."""
        if producer_id < 0:
            return APPEND, -1
        entry = self.producers.get(producer_id)
        if entry is None:
            return APPEND, -1
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} is older than {entry.epoch}", producer_id=producer_id
            )
        if epoch > entry.epoch:
            if base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} new epoch {epoch} must start at sequence 0, got {base_sequence}"
                )
            return APPEND, -1
        last_sequence = (base_sequence + record_count - 1) % SEQUENCE_MODULUS
        if _at_or_below(last_sequence, entry.last_sequence):
            for first, last, base_offset in entry.recent:
                if first == base_sequence and last == last_sequence:
                    return DUPLICATE, base_offset
            return DUPLICATE, -1
        expected = (entry.last_sequence + 1) % SEQUENCE_MODULUS
        if base_sequence == expected:
            return APPEND, -1
        raise OutOfOrderSequenceError(
            f"producer {producer_id} epoch {epoch}: sequence {base_sequence} after {entry.last_sequence}",
            producer_id=producer_id,
            expected_sequence=expected,
        )

    def record(self, producer_id: int, epoch: int, base_sequence: int, record_count: int, base_offset: int) -> None:
        """Remember an appended batch (called for every batch, also when rebuilding)."""
        if producer_id < 0:
            return
        now_s = self._clock()
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = ProducerEntry(epoch, -1)
            self.producers[producer_id] = entry
        self.producers.move_to_end(producer_id)
        entry.written_s = now_s
        last = (base_sequence + record_count - 1) % SEQUENCE_MODULUS
        if entry.last_sequence < 0 or not _at_or_below(last, entry.last_sequence):
            entry.last_sequence = last
        entry.recent.append((base_sequence, last, base_offset))
        if len(entry.recent) > RECENT_BATCHES_PER_PRODUCER:
            del entry.recent[0]
        while len(self.producers) > PRODUCERS_PER_PARTITION_MAX:
            self.producers.popitem(last=False)
        # Amortised: each record looks at the front only while it has expired.
        while self.producers:
            oldest = next(iter(self.producers.values()))
            if now_s - oldest.written_s < self._expiration_s:
                break
            self.producers.popitem(last=False)

    def clear(self) -> None:
        self.producers.clear()


def _at_or_below(sequence: int, last: int) -> bool:
    """Whether ``sequence`` is ``last`` or comes before it, modulo SEQUENCE_MODULUS (less than
    half the circle behind: a producer is never 2^30 records ahead of what a node stored)."""
    return (last - sequence) % SEQUENCE_MODULUS < SEQUENCE_MODULUS // 2

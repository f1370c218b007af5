"""Dead letters as the dead-letter topic takes them: what one holds, and batches within
that topic's ``message_bytes_max``. Pure (no node, no clock): ``nodes/queue_durable.py``
reads the records and the topic's limit, and writes.

A dead letter is its message plus the ``fabric.dlq.*`` headers (~120 bytes, at most
4,455), so a message near the queue's size limit can be too large for a dead-letter topic
with the same limit, and many together are larger than any one batch it takes. They
were packed up to 4 MiB a write: a 1 MiB dead-letter topic refused the batch, the write
was retried for ever, and the partition's receives and settles failed with it. Now they
are written in batches the topic takes, and one that fits no batch is dropped (counted,
with a warning): ``Admin.create_queue`` gives the dead-letter topic it makes room for the
headers (``qp.DEAD_LETTER_ROOM_BYTES``), so that is a dead-letter topic made or altered
smaller than its queue.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Final

from fabric.limits import BATCH_HEADER_BYTES, BATCH_UNCOMPRESSED_BYTES_MAX
from fabric.protocol import batch as batch_format
from fabric.protocol import queues as qp
from nodes.queue_state import DEAD, DROPPED, Change, Finished

log = logging.getLogger("fabric.queues")

# One write's bounds besides the dead-letter topic's message_bytes_max.
DEAD_LETTERS_PER_WRITE: Final[int] = 1_000
DEAD_LETTER_BYTES_PER_WRITE: Final[int] = 4 * 1024 * 1024
OFFSETS_LOGGED_MAX: Final[int] = 5  # offsets a warning names; the rest are counted
# Queue options that describe the original send; a dead letter does not carry them, so
# redriving it neither waits again nor expires nor is dropped as a duplicate.
_SEND_ONLY_HEADERS: Final[frozenset[str]] = frozenset(
    {qp.HEADER_DELAY_MS, qp.HEADER_DELIVER_AT_MS, qp.HEADER_TTL_MS, qp.HEADER_DEDUP_ID})

Headers = list[tuple[str, bytes | None]]
Letter = tuple[int, bytes | None, bytes | None, Headers]  # (timestamp, key, value, headers)


def dead_letter(queue: str, partition: int, f: Finished, record: Letter) -> Letter:
    """What the dead-letter topic gets for the message ``record`` at ``f.offset``: its
    timestamp, key, value and headers less the send-only and fabric.dlq.* ones, plus the
    fabric.dlq.* headers naming its origin (the reason cut to DEAD_LETTER_REASON_BYTES_MAX,
    so the headers stay within DEAD_LETTER_ROOM_BYTES)."""
    ts, key, value, headers = record
    kept = [(k, v) for k, v in headers if k not in _SEND_ONLY_HEADERS and k not in qp.DLQ_HEADERS]
    reason = f.reason.encode()[:qp.DEAD_LETTER_REASON_BYTES_MAX].decode("utf-8", "ignore")
    return ts, key, value, kept + qp.dead_letter_headers(queue, partition, f.offset, f.delivery_count, reason)


def letter_bytes(letter: Letter) -> int:
    """The letter's bytes in an uncompressed batch's records section (fabric/protocol/batch.py)."""
    _ts, key, value, headers = letter
    return (batch_format.RECORD_FIXED_BYTES + len(key or b"") + len(value or b"")
            + sum(2 + len(name.encode()) + 4 + len(v or b"") for name, v in headers))


def letter_fits(letter: Letter, message_bytes_max: int) -> bool:
    """Whether a batch of ``letter`` alone fits a topic's ``message_bytes_max`` as
    ``encode_letters`` makes it: uncompressed, or lz4 (a value the producer sent compressed)."""
    size = letter_bytes(letter)
    if size > BATCH_UNCOMPRESSED_BYTES_MAX:
        return False
    if BATCH_HEADER_BYTES + size <= message_bytes_max:
        return True
    return len(encode_letters([letter])) <= message_bytes_max


def next_dead_letter_write(letters: list[Letter | None], message_bytes_max: int) -> tuple[int, list[int], list[int]]:
    """The next dead-letter write, from the front of ``letters`` (None: a message retention
    removed meanwhile, nothing to move): how many it takes, the indices it writes, and the
    indices that no batch the dead-letter topic takes can hold (to be dropped). Sized
    uncompressed, so the batch fits whatever lz4 makes of it; a letter that fits only
    compressed goes alone. Takes at least one, so a letter that never fits holds up nothing."""
    room_bytes = min(message_bytes_max, DEAD_LETTER_BYTES_PER_WRITE) - BATCH_HEADER_BYTES
    written: list[int] = []
    unfit: list[int] = []
    written_bytes = 0
    taken = 0
    for i, letter in enumerate(letters):
        if letter is not None:
            size = letter_bytes(letter)
            if written and written_bytes + size > room_bytes:
                break  # the next write's
            if letter_fits(letter, message_bytes_max):
                written.append(i)
                written_bytes += size
            else:
                unfit.append(i)
        taken += 1
        if written_bytes >= room_bytes:
            break
    return taken, written, unfit


def unfit_letters(queue: str, partition: int, dead: list[Finished], found: dict[int, Letter],
                  dead_letter_topic: str, limit_bytes: int) -> list[Finished]:
    """Those of ``dead`` (their records in ``found``) whose dead letter fits no batch of a
    dead-letter topic of ``limit_bytes``: a message near the queue's size limit plus its
    fabric.dlq.* headers, or a dead-letter topic with a smaller message_bytes_max. They
    are dropped instead (as a dead letter SQS or RabbitMQ cannot deliver is lost), with a
    warning, and counted ``dropped``."""
    unfit = [f for f in dead if f.offset in found
             and not letter_fits(dead_letter(queue, partition, f, found[f.offset]), limit_bytes)]
    if unfit:
        log_dropped(queue, partition, unfit, dead_letter_topic, limit_bytes)
    return unfit


def as_dropped(changes: list[Change], offsets: set[int]) -> list[Change]:
    """``changes`` with those dead-lettering ``offsets`` dropping them instead."""
    if not offsets:
        return changes
    return [dataclasses.replace(c, state=DROPPED) if c.state == DEAD and c.offset in offsets else c for c in changes]


def encode_letters(letters: list[Letter], frame_bytes_max: int = 0) -> bytes:
    """One batch of ``letters``, lz4; uncompressed when lz4 makes it larger than
    ``frame_bytes_max`` (random values), which ``next_dead_letter_write`` sized it to fit."""
    columns = ([x[0] for x in letters], [x[1] for x in letters], [x[2] for x in letters], [x[3] for x in letters])
    frame = batch_format.encode_batch(*columns)
    if frame_bytes_max and len(frame) > frame_bytes_max:
        frame = batch_format.encode_batch(*columns, codec=batch_format.CODEC_NONE)
    return frame


def log_dropped(queue: str, partition: int, dropped: list[Finished], dead_letter_topic: str, limit_bytes: int) -> None:
    shown = ", ".join(str(f.offset) for f in dropped[:OFFSETS_LOGGED_MAX])
    if len(dropped) > OFFSETS_LOGGED_MAX:
        shown += f" and {len(dropped) - OFFSETS_LOGGED_MAX} more"
    log.warning("queue %s/%d: %d messages (offsets %s) dropped, not dead-lettered: with their fabric.dlq.* "
                "headers each is larger than dead-letter topic %s's message_bytes_max=%d",
                queue, partition, len(dropped), shown, dead_letter_topic, limit_bytes)

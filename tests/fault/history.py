"""A history of what was sent, acknowledged and read, and the checker that judges it.

Every fault test records:

* ``sent``: every value a producer attempted (values are unique per test);
* ``acked``: value -> (partition, offset) for every write a node acknowledged;
* ``reads``: per consumer, the (partition, offset, value) it received, in order;
* ``replicas``: after healing, each node's stored batches per partition.

The checker reports, as in the issue:

* **lost**: acknowledged but never read back (or read at another offset than acknowledged);
* **unexpected**: read but never sent;
* **duplicate**: one value at two offsets;
* **reordered**: a consumer saw a partition's offsets go backwards or skip;
* **divergent**: two replicas hold different bytes at one offset, or end at different offsets.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class History:
    sent: set[bytes] = field(default_factory=set)
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    failed: dict[bytes, str] = field(default_factory=dict)
    reads: dict[str, list[tuple[int, int, bytes]]] = field(default_factory=lambda: defaultdict(list))
    replicas: dict[int, dict[int, dict[int, bytes]]] = field(default_factory=dict)  # node -> partition -> base -> bytes
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record_sent(self, value: bytes) -> None:
        with self.lock:
            self.sent.add(value)

    def record_ack(self, value: bytes, partition: int, offset: int) -> None:
        with self.lock:
            self.acked[value] = (partition, offset)

    def record_failure(self, value: bytes, error: BaseException) -> None:
        with self.lock:
            self.failed[value] = type(error).__name__

    def record_read(self, reader: str, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            self.reads[reader].append((partition, offset, value))


@dataclass
class Report:
    lost: list[tuple[bytes, tuple[int, int]]]
    unexpected: list[bytes]
    duplicate: dict[bytes, set[tuple[int, int]]]
    reordered: list[str]
    divergent: list[str]
    acked: int
    read: int

    def ok(self, *, allow_duplicates: bool = False) -> bool:
        return not (self.lost or self.unexpected or self.reordered or self.divergent
                    or (self.duplicate and not allow_duplicates))

    def summary(self) -> str:
        return (
            f"acked={self.acked} read={self.read} lost={len(self.lost)} unexpected={len(self.unexpected)} "
            f"duplicate={len(self.duplicate)} reordered={len(self.reordered)} divergent={len(self.divergent)}; "
            f"first lost={self.lost[:3]} reordered={self.reordered[:3]} divergent={self.divergent[:3]}"
        )


def check(history: History, *, final_reader: str = "final") -> Report:
    """Judge a history. ``final_reader`` read every partition from the beginning after healing."""
    where_read: dict[bytes, set[tuple[int, int]]] = defaultdict(set)
    reordered: list[str] = []
    for reader, reads in history.reads.items():
        last: dict[int, int] = {}
        for partition, offset, value in reads:
            where_read[value].add((partition, offset))
            previous = last.get(partition)
            if previous is not None and offset != previous + 1:
                kind = "backwards" if offset <= previous else "skipped"
                reordered.append(f"{reader}: partition {partition} went {kind} from {previous} to {offset}")
            last[partition] = offset
    final_values = {value: (p, o) for p, o, value in history.reads.get(final_reader, [])}
    lost = []
    for value, position in history.acked.items():
        if final_values.get(value) != position:
            lost.append((value, position))
    unexpected = sorted(v for v in where_read if v not in history.sent)
    duplicate = {v: places for v, places in where_read.items() if len(places) > 1}
    return Report(lost, unexpected, duplicate, reordered, divergence(history.replicas), len(history.acked),
                  len(final_values))


def divergence(replicas: dict[int, dict[int, dict[int, bytes]]]) -> list[str]:
    """Compare each partition's stored batches across the nodes that hold it."""
    problems: list[str] = []
    partitions: dict[int, dict[int, dict[int, bytes]]] = defaultdict(dict)
    for node, by_partition in replicas.items():
        for partition, batches in by_partition.items():
            partitions[partition][node] = batches
    for partition, by_node in sorted(partitions.items()):
        nodes = sorted(by_node)
        reference = by_node[nodes[0]]
        for node in nodes[1:]:
            other = by_node[node]
            if set(other) != set(reference):
                missing = sorted(set(reference) ^ set(other))[:5]
                problems.append(f"partition {partition}: nodes {nodes[0]} and {node} hold different batches {missing}")
                continue
            for base, data in reference.items():
                if other[base] != data:
                    problems.append(f"partition {partition} offset {base}: nodes {nodes[0]} and {node} differ")
                    break
    return problems


def producer_order(history: History, writer_label: str) -> list[str]:
    """Writes of one producer that a partition holds out of send order.

    Values are ``<label>-<i>`` with ``i`` counting up in send order; the idempotent
    producer must leave each partition's acknowledged values in increasing ``i`` by offset,
    also when pipelined batches were resent after a failure."""
    prefix = f"{writer_label}-".encode()
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for value, (partition, offset) in history.acked.items():
        if value.startswith(prefix):
            by_partition[partition].append((offset, int(value[len(prefix):])))
    problems: list[str] = []
    for partition, pairs in sorted(by_partition.items()):
        pairs.sort()
        for (offset_a, i_a), (offset_b, i_b) in itertools.pairwise(pairs):
            if i_b <= i_a:
                problems.append(f"partition {partition}: send {i_b} at offset {offset_b} after send {i_a} at {offset_a}")
                break
    return problems

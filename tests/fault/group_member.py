"""A consumer-group member process for the group fault test.

    python -m tests.fault.group_member BOOTSTRAP TOPIC GROUP NAME LOG_PATH

Subscribes, and for every record it receives "processes" it (one JSON line in LOG_PATH),
then commits what it processed. Ownership changes are logged too. Lines are written with
os.write on an O_APPEND descriptor, so a SIGKILL loses nothing already written. SIGTERM
makes it close() cleanly (commit, leave). Times are CLOCK_MONOTONIC, shared by every
process on the machine, so the checker can order events across members.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from fabric import errors
from sdk import Consumer, TopicPartition
from sdk._group import ConsumerRebalanceListener

SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_INTERVAL_MS = 1_000


def main(argv: list[str]) -> int:
    bootstrap, topic, group, name, log_path = argv
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(**fields: Any) -> None:
        os.write(fd, (json.dumps({"m": name, "t": time.monotonic(), **fields}) + "\n").encode())

    class Listener(ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
            for tp in assigned:
                emit(ev="assigned", p=tp.partition)

        def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
            for tp in revoked:
                emit(ev="revoked", p=tp.partition)

        def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
            for tp in lost:
                emit(ev="lost", p=tp.partition)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    consumer = Consumer(bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
                        session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS)
    emit(ev="start", pid=os.getpid())
    consumer.subscribe([topic], listener=Listener())
    while not stop.is_set():
        try:
            records = consumer.poll(timeout_ms=200)
        except errors.FabricError as exc:
            emit(ev="poll_error", error=str(exc))
            time.sleep(0.1)
            continue
        processed: dict[TopicPartition, int] = {}
        for r in records:
            emit(ev="processed", p=r.partition, o=r.offset, v=(r.value or b"").decode())
            processed[TopicPartition(r.topic, r.partition)] = r.offset + 1
        if processed:
            try:
                consumer.commit(processed)
                emit(ev="committed", offsets={str(tp.partition): o for tp, o in processed.items()})
            except errors.FabricError as exc:
                emit(ev="commit_failed", error=str(exc))
    consumer.close()
    emit(ev="closed")
    os.close(fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

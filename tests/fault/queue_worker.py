"""A queue worker process for tests/fault/test_queue_fault.py: receive, "process", ack.

Writes one JSON line per event to its log (flushed at once, so a SIGKILL loses at most the
line being written): ``recv`` (what a receive returned), ``acking`` (about to ack),
``acked`` (the ack returned: these are done), ``ack_lost`` (the ack was refused for these:
their lease had ended), ``nack`` (poison messages given back). Messages whose value starts
with ``poison`` are always nacked, so they end in the dead-letter queue.

    python -m tests.fault.queue_worker BOOTSTRAP QUEUE NAME LOG
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from fabric import errors
from sdk import QueueConsumer, QueueMessage


def main(argv: list[str]) -> int:
    bootstrap, queue, name, log_path = argv
    with open(log_path, "a", buffering=1) as log:
        def event(ev: str, msgs: list[QueueMessage], **extra: Any) -> None:
            ids = [[(m.value or b"").decode(), m.partition, m.offset, m.delivery_count] for m in msgs]
            log.write(json.dumps({"ev": ev, "t": time.time(), "ids": ids, **extra}) + "\n")

        worker = QueueConsumer(bootstrap, queue, "workers", consumer_id=name)
        while True:
            try:
                batch = worker.receive(50, 1_000)
            except errors.FabricError as exc:  # a node failing over: ask again
                log.write(json.dumps({"ev": "error", "t": time.time(), "what": str(exc)}) + "\n")
                time.sleep(0.1)
                continue
            if not batch:
                continue
            event("recv", batch)
            poison = [m for m in batch if (m.value or b"").startswith(b"poison")]
            good = [m for m in batch if m not in poison]
            if poison:
                try:
                    worker.nack(poison, reason="poison")
                    event("nack", poison)
                except errors.LeaseNotHeldError as exc:
                    event("nack_lost", exc.lost)
            if good:
                event("acking", good)
                try:
                    worker.ack(good)
                    event("acked", good)
                except errors.LeaseNotHeldError as exc:
                    lost = exc.lost
                    event("ack_lost", lost)
                    event("acked", [m for m in good if m not in lost])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

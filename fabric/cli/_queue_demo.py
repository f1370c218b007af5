"""The demo's queue-mode step (``fabric demo``): 4 competing workers drain a work queue."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sdk import Admin

POISON_EVERY = 400  # every 400th job always fails: it must end in the dead-letter queue
DELAYED_EVERY = 100  # every 100th job is sent with a delay and must not arrive early
DELAY_MS = 300
DEDUP_WINDOW_MS = 1_000  # short, so the consumed jobs are deleted within the demo (docs/QUEUES.md)
# A worker's long poll. Short, because a poll of a closed worker stays parked on a leader
# until its wait ends, and the group cannot be deleted while one is (docs/QUEUES.md).
WORKER_WAIT_MS = 500
# How long the demo retries deleting the worker group while a leader refuses it: a parked
# poll ends within WORKER_WAIT_MS; the rest is for a leader's timer and a busy machine.
GROUP_DELETE_WAIT_MS = WORKER_WAIT_MS + 4_500
GROUP_DELETE_RETRY_MS = 100
STALE_JOBS = 300  # sent once the work is done, then purged (fabric queue purge): none is delivered


def queue_demo(bootstrap: str, jobs: int = 2_000, workers: int = 4) -> dict[str, object]:
    from sdk import Admin, Consumer, Producer, QueueConsumer, TopicPartition

    queue, dlq = "demo-jobs", "demo-jobs.dlq"
    print(f"== queue mode: {jobs:,} jobs to {workers} competing workers (acks after processing), "
          f"poison jobs to {dlq}, delayed and priority jobs", flush=True)
    with Admin(bootstrap) as admin:
        admin.create_queue(queue, partitions=2, max_deliveries=2, dead_letter=dlq, visibility_timeout_ms=10_000,
                           dedup_window_ms=DEDUP_WINDOW_MS)
    due_ms: dict[bytes, float] = {}
    poison = {f"job-{i}".encode() for i in range(jobs) if i % POISON_EVERY == 7}
    with Producer(bootstrap, linger_ms=5) as producer:
        for i in range(jobs):
            value = f"job-{i}".encode()
            if i % DELAYED_EVERY == 3:
                due_ms[value] = time.time() * 1000 + DELAY_MS
                producer.send(queue, value, delay_ms=DELAY_MS)
            else:
                producer.send(queue, value, priority=9 if i % 10 == 0 else None)
        producer.flush(timeout=60)
    acked: dict[bytes, int] = {}
    early: list[bytes] = []
    lock = threading.Lock()
    good = jobs - len(poison)

    def work() -> None:
        with QueueConsumer(bootstrap, queue, "demo-workers") as worker:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with lock:
                    if sum(acked.values()) >= good:
                        return
                batch = worker.receive(50, WORKER_WAIT_MS)
                now_ms = time.time() * 1000
                ok = [m for m in batch if m.value not in poison]
                bad = [m for m in batch if m.value in poison]
                if bad:
                    worker.nack(bad, reason="demo poison")
                if ok:
                    worker.ack(ok)
                with lock:
                    for m in ok:
                        value = m.value or b""
                        acked[value] = acked.get(value, 0) + 1
                        if value in due_ms and now_ms < due_ms[value]:
                            early.append(value)
                    if sum(acked.values()) >= good and not finished_at:
                        finished_at.append(time.perf_counter())

    finished_at: list[float] = []
    threads = [threading.Thread(target=work, name=f"demo-worker-{i}") for i in range(workers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = (finished_at[0] if finished_at else time.perf_counter()) - started
    dead: set[bytes] = set()
    with QueueConsumer(bootstrap, dlq, "demo-check") as reader:
        deadline = time.monotonic() + 20
        while len(dead) < len(poison) and time.monotonic() < deadline:
            batch = reader.receive(100, 500)
            dead.update(m.value or b"" for m in batch)
            if batch:
                reader.ack(batch)
    once = len(acked) == good and all(n == 1 for n in acked.values())
    # Every job finished: the leaders delete the consumed batches (past the dedup window).
    partitions = [TopicPartition(queue, p) for p in range(2)]
    left = -1
    with Consumer(bootstrap) as offsets:
        deadline = time.monotonic() + 20
        while left != 0 and time.monotonic() < deadline:
            start, end = offsets.beginning_offsets(partitions), offsets.end_offsets(partitions)
            left = sum(end[tp] - start[tp] for tp in partitions)
            if left:
                time.sleep(0.25)
    # A backlog nobody wants any more (jobs of a cancelled run): purged, as SQS's
    # PurgeQueue, `fabric queue purge demo-jobs --group demo-workers`; none is delivered.
    with Producer(bootstrap, linger_ms=5) as producer:
        producer.send_batch(queue, [f"stale-{i}".encode() for i in range(STALE_JOBS)]).result(30)
    with Admin(bootstrap) as admin:
        purged = admin.purge_queue(queue, "demo-workers").get("demo-workers", 0)
    with QueueConsumer(bootstrap, queue, "demo-workers") as late:
        delivered_after_purge = len(late.receive(100, WORKER_WAIT_MS))
    # The work is done and its workers are gone: retire their group, as an operator would
    # with `fabric queue delete-group demo-jobs demo-workers`, so it no longer counts
    # toward the queue's group limit.
    with Admin(bootstrap) as admin:
        deleted, tries, refusal = delete_queue_group_when_idle(admin, queue, "demo-workers", GROUP_DELETE_WAIT_MS)
        gone = not refusal and "demo-workers" not in admin.describe_queue_groups(queue)
    return {"queue_jobs": jobs, "queue_workers": workers, "queue_msgs_per_s": round(jobs / elapsed),
            "queue_acked_once": once, "queue_dead_letters": len(dead), "queue_delayed_early": len(early),
            "queue_records_left": left, "queue_group_deleted": gone, "queue_group_deleted_partitions": deleted,
            "queue_group_delete_tries": tries, "queue_group_delete_refusal": refusal,
            "queue_purged": purged, "queue_delivered_after_purge": delivered_after_purge,
            "queue_ok": once and dead == poison and not early and left == 0 and gone and purged == STALE_JOBS
            and delivered_after_purge == 0}


def delete_queue_group_when_idle(admin: Admin, queue: str, group: str, wait_ms: int,
                                 retry_ms: int = GROUP_DELETE_RETRY_MS) -> tuple[list[int], int, str]:
    """``admin.delete_queue_group(queue, group)``, tried again while a leader refuses it
    with GROUP_NOT_EMPTY (a closed worker's long poll still parked there), for at most
    ``wait_ms``. Returns the partitions it was deleted on, the number of tries and the last
    refusal ("" once deleted). A refused try may have deleted the group on another leader
    already: the next try finds it gone there (not an error) and deletes the rest."""
    from fabric import errors

    deleted: set[int] = set()
    deadline = time.monotonic() + wait_ms / 1000.0
    tries = 0
    while True:
        tries += 1
        try:
            deleted.update(admin.delete_queue_group(queue, group))
            return sorted(deleted), tries, ""
        except errors.GroupIdNotFoundError as exc:
            # Gone everywhere: deleted by an earlier, partly refused, try (or never there).
            return sorted(deleted), tries, "" if tries > 1 else exc.message
        except errors.GroupNotEmptyError as exc:
            if time.monotonic() + retry_ms / 1000.0 > deadline:
                return sorted(deleted), tries, exc.message
            time.sleep(retry_ms / 1000.0)

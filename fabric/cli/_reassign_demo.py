"""The demo's operations step (``fabric demo``): a node joins, a partition moves onto it, and the
topic's retention is changed."""

from __future__ import annotations

import time
from typing import Any

DEMO_THROTTLE_BYTES_PER_S = 5_000_000  # enough to finish in seconds, low enough to be a real limit
MOVE_TIMEOUT_S = 120.0
COPIES_SETTLE_S = 30.0  # after the move: the old copy deleted, the new one at the leader's log end
DEMO_RETENTION_MS = 86_400_000  # what `fabric topic alter` sets afterwards: one day


def reassign_demo(cluster: Any, topic: str) -> dict[str, object]:
    """Start one more node, move ``topic``'s partition 0 onto it (the current leader's copy
    is the one replaced, so leadership moves too), and check every record is on the new
    node: its log end equals the leader's."""
    from sdk import Admin

    new_node = max(cluster.nodes) + 1
    print(f"== operations: node {new_node} joins; {topic}/0 moves onto it "
          f"(throttle {DEMO_THROTTLE_BYTES_PER_S // 1_000_000} MB/s), the old leader's copy goes", flush=True)
    cluster.add_node(new_node)
    with Admin(cluster.bootstrap) as admin:
        before = admin.describe_topic(topic).partitions[0]
        target = [new_node, *[r for r in before.replicas if r != before.leader]]
        began = time.monotonic()
        admin.reassign_partition(topic, 0, target, throttle_bytes_per_s=DEMO_THROTTLE_BYTES_PER_S)
        admin.wait_reassigned(topic, 0, target, timeout_s=MOVE_TIMEOUT_S)
        moved_s = time.monotonic() - began
        after = admin.describe_topic(topic).partitions[0]
        # The replaced copy is deleted, and the new copy's log end meets the leader's, each a
        # moment after the move completes: look until both hold or COPIES_SETTLE_S passes.
        settle_by = time.monotonic() + COPIES_SETTLE_S
        while True:
            copies = {r["node_id"]: r for r in admin.describe_replicas([topic]).get((topic, 0), [])}
            leader_copy = copies.get(after.leader)
            new_copy = copies.get(new_node)
            ok = (tuple(after.replicas) == tuple(target) and new_node in after.isr and before.leader not in copies
                  and leader_copy is not None and new_copy is not None
                  and new_copy["log_end_offset"] == leader_copy["log_end_offset"])
            if ok or time.monotonic() > settle_by:
                break
            time.sleep(0.2)
        # Then the topic keeps a day instead of seven (as `fabric topic alter` does).
        admin.alter_topic_config(topic, {"retention_ms": DEMO_RETENTION_MS})
        settle_by = time.monotonic() + COPIES_SETTLE_S
        while True:
            altered = admin.describe_topic(topic).configs.get("retention_ms") == str(DEMO_RETENTION_MS)
            if altered or time.monotonic() > settle_by:
                break
            time.sleep(0.1)
    return {"reassign_ok": ok, "alter_ok": altered, "alter_retention_ms": DEMO_RETENTION_MS,
            "reassign_from": list(before.replicas), "reassign_to": target,
            "reassign_seconds": round(moved_s, 2),
            "reassign_bytes": new_copy["size_bytes"] if new_copy is not None else 0}

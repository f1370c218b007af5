"""The README's main job, `python3 -m fabric demo`, run small: every check in its summary passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fabric.local import zookeeper_available

pytestmark = pytest.mark.skipif(not zookeeper_available(), reason="ZooKeeper is not installed")


def test_demo_runs_and_every_check_passes() -> None:
    result = subprocess.run([sys.executable, "-m", "fabric", "demo", "--messages", "5000"],
                            capture_output=True, text=True, timeout=400, env=dict(os.environ), check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["messages_consumed"] == summary["messages_produced"] == 5000
    assert summary["checksum_match"]
    assert summary["strict_order_ok"]
    assert summary["group_ok"]
    assert summary["group_paused_partitions"] > 0 and summary["group_records_while_paused"] == 0
    assert summary["direct_ok"]
    assert summary["queue_ok"] and summary["queue_acked_once"] and summary["queue_delayed_early"] == 0
    assert summary["queue_records_left"] == 0  # the consumed jobs were deleted
    assert summary["queue_purged"] == 300 and summary["queue_delivered_after_purge"] == 0  # fabric queue purge
    # Then the worker group, as `fabric queue delete-group` would (retried while a closed
    # worker's long poll was still parked), and it is no longer listed.
    assert summary["queue_group_deleted"] and summary["queue_group_delete_refusal"] == ""
    assert "group demo-workers deleted (fabric queue delete-group) from" in result.stdout
    assert summary["reassign_ok"] and summary["reassign_bytes"] > 0
    assert summary["alter_ok"] and summary["alter_retention_ms"] == 86_400_000
    assert "Traceback" not in result.stderr

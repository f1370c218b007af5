"""The peers benchmark runs in its short mode, so it cannot rot: every system has its rows,
every count was checked by the benchmark itself, and the report files are written.

Skipped (not failed) only where a peer's server binary or client library is missing on
this machine; ``scripts/install.sh`` installs them all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.local import zookeeper_available

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 600


def _missing() -> list[str]:
    out = [b for b in ("nats-server", "redis-server") if shutil.which(b) is None]
    for module in ("nats", "redis", "matplotlib", "hdrh", "rich"):
        try:
            __import__(module)
        except ImportError:
            out.append(f"python module {module}")
    if not zookeeper_available():
        out.append("zookeeper")
    return out


@pytest.mark.skipif(bool(_missing()), reason=f"peers benchmark needs: {', '.join(_missing())}")
def test_short_mode_reports_every_system(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(
        [sys.executable, "-m", "bench.peers", "--short", "--quiet", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures == json.loads((tmp_path / "peers.json").read_text())
    assert set(figures["systems"]) == {"fabric_rf1", "fabric_rf3", "nats", "redis"}
    for key, row in figures["systems"].items():
        assert row["status"] == "ok", (key, row["status"])
        assert row["durability"], key
        assert row["publish_msgs_per_s"] > 0 and row["consume_msgs_per_s"] > 0, key
        # The benchmark raises unless the consumer saw every message; here: it said so.
        assert row["e2e"]["samples"] == figures["e2e_rate_per_s"] * figures["e2e_seconds"], key
        assert 0 < row["e2e"]["p50_ms"] <= row["e2e"]["p99_ms"] <= row["e2e"]["p999_ms"] <= row["e2e"]["max_ms"]
    for key in ("nats_core", "zmq_raw"):
        assert figures["request_reply"][key]["status"] == "ok"
        assert figures["request_reply"][key]["latency"]["samples"] == figures["requests"]
    direct = figures["request_reply"]["fabric_direct"]
    if importlib.util.find_spec("sdk.direct") is not None:
        assert direct["status"] == "ok" and direct["latency"]["samples"] == figures["requests"], direct
    else:
        assert direct["status"].startswith("not built yet")
    table = (tmp_path / "peers.md").read_text()
    for row in figures["systems"].values():
        assert row["label"] in table
    for png in ("peers_throughput.png", "peers_latency.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

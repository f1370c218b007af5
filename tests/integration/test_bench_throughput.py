"""``python -m bench`` as an outside reviewer runs it: its JSON keys are the ones
docs/BENCHMARKS.md lists, the baseline is measured from a started sink (its process's
start-up made the baseline look several times slower on short runs), and Ctrl-C ends it
with one line, exit status 130, no process and no temporary directory left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabric.local import zookeeper_available
from tests.unit.test_bench_arguments import assert_keys_documented, documented_keys

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not zookeeper_available(), reason="needs ZooKeeper")


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp), "PYTHONFAULTHANDLER": "1",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _leftovers(tmp: Path) -> list[str]:
    """Processes whose command line names a path under ``tmp`` (nodes, ZooKeeper, the sink)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(tmp) in cmdline and str(os.getpid()) != proc.name:
            out.append(cmdline)
    return out


def test_short_run_prints_the_documented_keys(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "bench", "--messages", "2000", "--repeats", "1", "--sizes", "100"],
                            cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert_keys_documented(set(figures), documented_keys("bench.throughput", size="100"))
    assert figures["produce_100b_ratio_to_baseline"] == pytest.approx(
        figures["produce_100b_msgs_per_s"] / figures["baseline_produce_100b_msgs_per_s"], rel=0.01)
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_stops_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "bench", "--messages", "50000000", "--repeats", "3", "--sizes", "100"],
                            cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as a terminal's foreground job
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once the node is up and the runs begin
        assert first.startswith("one node"), first
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole group
        try:
            _out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack, for the report
            _out, err = proc.communicate(timeout=30)
            pytest.fail(f"still running 60 s after Ctrl-C; its threads:\n{err[-8000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert err.strip() == "interrupted"
    deadline = time.monotonic() + 10
    while _leftovers(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers(tmp_path) == []
    assert list(tmp_path.iterdir()) == []

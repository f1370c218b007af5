"""``fabric up`` whose node cannot start says why in one line, the node's own reason, and
exits 1 (docs/PROTOCOL.md section 13). OPERATIONS' sample node1.toml sets ``host`` to an
address of another machine; `fabric up` keeps ``host``, so its node cannot listen there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 60.0  # ZooKeeper's start and one node's failure take about 2 s; a hang is what this catches
NOT_HERE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this machine


def test_a_node_that_cannot_listen_fails_fabric_up_in_one_clean_line(tmp_path: Path) -> None:
    config = tmp_path / "node1.toml"
    config.write_text(f'host = "{NOT_HERE}"\nlog_format = "json"\n')  # json: its lines were pasted into the error
    data_dir = tmp_path / "data"
    env = {**os.environ, "FABRIC_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    env.pop("FABRIC_DEBUG", None)
    done = subprocess.run([sys.executable, "-m", "fabric", "up", "--nodes", "1", "--config", str(config),
                           "--data-dir", str(data_dir)],
                          env=env, capture_output=True, text=True, timeout=UP_TIMEOUT_S, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"fabric: error: node 1 could not start: cannot listen on tcp://{NOT_HERE}:"), lines[0]
    assert "Cannot assign requested address" in lines[0]
    assert lines[0].endswith(f"(log: {data_dir / 'node1.log'})"), lines[0]
    assert "internal error" not in done.stderr and "RuntimeError" not in done.stderr and '"ts"' not in done.stderr
    assert not (tmp_path / "home" / "local.json").exists()  # nothing recorded: there is no cluster

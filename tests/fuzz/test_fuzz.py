"""The bounded CI run of the coverage-guided fuzzer: every target, a fixed number of inputs,
a fixed seed. The long run is documented in docs/SECURITY.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz import targets

pytest.importorskip("atheris", reason="atheris is in the test extras (pip install atheris)")

ROOT = Path(__file__).parents[2]
RUNS_PER_TARGET = 20_000
SEED = 1


@pytest.mark.parametrize("target", sorted(targets.TARGETS))
def test_fuzz_target_bounded(target: str, tmp_path: Path) -> None:
    env = {**os.environ, "FABRIC_FUZZ_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.run", target, f"-runs={RUNS_PER_TARGET}", f"-seed={SEED}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    crashes = sorted(p.name for p in (tmp_path / "crashes").iterdir())
    assert result.returncode == 0 and not crashes, (
        f"fuzz target {target} failed (exit {result.returncode}); crash inputs {crashes} in {tmp_path}; "
        f"copy them to tests/vectors/fuzz/. Output tail:\n{result.stderr[-3000:]}"
    )
    # libFuzzer's count may pass -runs by the inputs of the batch it was in (CI once
    # printed "Done 20057 runs" for 20000): the run ended by its bound, having done them all.
    done = re.search(r"^Done (\d+) runs", result.stderr, re.MULTILINE)
    assert done is not None and int(done.group(1)) >= RUNS_PER_TARGET, result.stderr[-500:]

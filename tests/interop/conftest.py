"""Build the C client once per session; skip only when the toolchain is truly absent.

CI installs gcc, make, libzmq3-dev, liblz4-dev and zlib1g-dev, so there these tests run.
A build *failure* with the toolchain present is a test failure, never a skip.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SDK_C = REPO / "sdk" / "c"
VECTORS = REPO / "tests" / "vectors"
BUILD_TIMEOUT_S = 300

_PROBE = "#include <zmq.h>\n#include <lz4frame.h>\n#include <zlib.h>\nint main(void) { return 0; }\n"


@dataclass(frozen=True)
class CClient:
    root: Path
    produce: Path
    consume: Path
    test_vectors: Path
    test_bad_input: Path


def _missing_toolchain() -> str | None:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return "no C compiler (gcc) on PATH"
    if shutil.which("make") is None:
        return "make is not installed"
    cflags: list[str] = []
    if shutil.which("pkg-config"):
        out = subprocess.run(["pkg-config", "--cflags", "libzmq", "liblz4", "zlib"],
                             capture_output=True, text=True, check=False)
        if out.returncode == 0:
            cflags = out.stdout.split()
    probe = subprocess.run([compiler, *cflags, "-x", "c", "-fsyntax-only", "-"], input=_PROBE,
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return ("C headers missing (apt-get install -y libzmq3-dev liblz4-dev zlib1g-dev): "
                + probe.stderr.strip().splitlines()[0])
    return None


@pytest.fixture(scope="session")
def c_client() -> CClient:
    missing = _missing_toolchain()
    if missing is not None:
        pytest.skip(f"C client not built: {missing}")
    result = subprocess.run(["make", "-C", str(SDK_C), "-j2"], capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S, check=False)
    if result.returncode != 0:
        pytest.fail(f"make -C sdk/c failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return CClient(
        root=SDK_C,
        produce=SDK_C / "fabric-produce",
        consume=SDK_C / "fabric-consume",
        test_vectors=SDK_C / "test_vectors",
        test_bad_input=SDK_C / "build" / "test_bad_input",
    )

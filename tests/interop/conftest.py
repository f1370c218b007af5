"""Build the C client once per session; skip only when the toolchain is truly absent.

CI installs gcc, make, libzmq3-dev, liblz4-dev and zlib1g-dev, so there these tests run.
A build *failure* with the toolchain present is a test failure, never a skip.

FABRIC_C_SANITIZE=1 runs every test against `make sanitize` (AddressSanitizer +
UndefinedBehaviorSanitizer, in sdk/c/build/sanitize/) instead of the normal build: a
sanitizer report then fails the program, and so the test that ran it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SDK_C = REPO / "sdk" / "c"
VECTORS = REPO / "tests" / "vectors"
BUILD_TIMEOUT_S = 300
SANITIZE_DIR = SDK_C / "build" / "sanitize"
# What `make sanitize` compiles with (sdk/c/Makefile SANITIZE_FLAGS): a program the tests
# build against its libfabric.a must link the same runtimes.
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")
# Exit codes no test expects from a program, so that a report is not taken for the
# program's own failure (exit 1); LeakSanitizer's 23 is already distinct.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "exitcode=86:detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "exitcode=87:print_stacktrace=1",
}

_PROBE = "#include <zmq.h>\n#include <lz4frame.h>\n#include <zlib.h>\nint main(void) { return 0; }\n"


@dataclass(frozen=True)
class CClient:
    root: Path  # sdk/c: the headers
    produce: Path
    consume: Path
    test_vectors: Path
    test_bad_input: Path
    test_api_args: Path
    test_deadlines: Path
    static_lib: Path  # libfabric.a, for the programs the tests compile
    cflags: tuple[str, ...] = ()  # extra gcc flags those programs need (the sanitizers')
    sanitized: bool = False


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


def sanitize_requested() -> bool:
    return os.environ.get("FABRIC_C_SANITIZE", "") not in ("", "0")


@pytest.fixture(scope="session")
def c_client() -> Iterator[CClient]:
    missing = _missing_toolchain()
    if missing is not None:
        pytest.skip(f"C client not built: {missing}")
    sanitized = sanitize_requested()
    target = ["sanitize"] if sanitized else []
    result = subprocess.run(["make", "-C", str(SDK_C), "-j2", *target], capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S, check=False)
    if result.returncode != 0:
        pytest.fail(f"make -C sdk/c {' '.join(target)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    if not sanitized:
        yield CClient(
            root=SDK_C,
            produce=SDK_C / "fabric-produce",
            consume=SDK_C / "fabric-consume",
            test_vectors=SDK_C / "test_vectors",
            test_bad_input=SDK_C / "build" / "test_bad_input",
            test_api_args=SDK_C / "build" / "test_api_args",
            test_deadlines=SDK_C / "build" / "test_deadlines",
            static_lib=SDK_C / "libfabric.a",
        )
        return
    with pytest.MonkeyPatch.context() as env:
        for name, value in SANITIZER_ENV.items():
            env.setenv(name, value)
        yield CClient(
            root=SDK_C,
            produce=SANITIZE_DIR / "fabric-produce",
            consume=SANITIZE_DIR / "fabric-consume",
            test_vectors=SANITIZE_DIR / "test_vectors",
            test_bad_input=SANITIZE_DIR / "test_bad_input",
            test_api_args=SANITIZE_DIR / "test_api_args",
            test_deadlines=SANITIZE_DIR / "test_deadlines",
            static_lib=SANITIZE_DIR / "libfabric.a",
            cflags=SANITIZE_FLAGS,
            sanitized=True,
        )

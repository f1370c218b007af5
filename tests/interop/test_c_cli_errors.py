"""The C examples given a ZooKeeper address say plainly that they need node addresses,
and their default acks are the Python CLI's (all)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.interop.conftest import CClient

pytestmark = pytest.mark.interop


@pytest.mark.parametrize("tool", ["produce", "consume"])
def test_zookeeper_bootstrap_is_refused_plainly(c_client: CClient, tool: str) -> None:
    binary = c_client.produce if tool == "produce" else c_client.consume
    args = [str(binary), "-b", "zk://127.0.0.1:2181", "-t", "events"] + (["-p", "0"] if tool == "consume" else [])
    done = subprocess.run(args, input=b"", capture_output=True, timeout=30, check=False)
    message = done.stderr.decode()
    assert done.returncode == 2
    assert "is a ZooKeeper address; the C client needs node addresses" in message
    assert len(message.strip().splitlines()) == 1


def test_default_acks_match_the_python_cli(c_client: CClient) -> None:
    from fabric.cli import build_parser

    usage = subprocess.run([str(c_client.produce), "--help"], capture_output=True, timeout=30, check=False)
    assert "default all" in usage.stdout.decode()
    assert build_parser().parse_args(["produce", "t"]).acks == "all"


@pytest.mark.parametrize(
    ("tool", "flags"),
    [
        ("produce", ["--acks", "al"]),  # was acks 0 (atoi): fire and forget, silently
        ("produce", ["--acks", "2"]),
        ("produce", ["-p", "abc"]),  # was partition 0
        ("produce", ["-p", "-3"]),
        ("produce", ["--linger-ms", "5ms"]),
        ("produce", ["--batch-bytes", "-1"]),
        ("produce", ["--timeout-ms", "abc"]),  # was 0: every record failed at the flush
        ("consume", ["-p", "abc"]),  # was partition 0
        ("consume", ["-p", "0", "-o", "abc"]),  # was offset 0
        ("consume", ["-p", "0", "-o", "-5"]),
        ("consume", ["-p", "0", "-c", "ten"]),  # was 0 records, exit 0
        ("consume", ["-p", "0", "-i", "2s"]),
        ("consume", ["-p", "0", "--metadata-wait-ms", "-2"]),  # -1 is "no limit"; below it nothing
        ("consume", ["-p", "0", "-m", "1m"]),
    ],
)
def test_bad_numbers_are_refused_not_read_as_zero(c_client: CClient, tool: str, flags: list[str]) -> None:
    """Numeric flags take a whole integer in range, else exit 2 naming the flag, before any
    connection (nothing listens on the bootstrap address)."""
    binary = c_client.produce if tool == "produce" else c_client.consume
    args = [str(binary), "-b", "tcp://127.0.0.1:1", "-t", "events", *flags]
    done = subprocess.run(args, input=b"x\n", capture_output=True, timeout=30, check=False)
    message = done.stderr.decode()
    assert done.returncode == 2, message
    assert "wants an integer in" in message, message
    assert len(message.strip().splitlines()) == 1


def test_install_prefix_reaches_the_pkg_config_file(c_client: CClient, tmp_path: Path) -> None:
    """docs/C_CLIENT.md: `make -C sdk/c`, then `make -C sdk/c install PREFIX=...`, then
    `gcc app.c $(pkg-config --cflags --libs fabric)`. The install copied the fabric.pc the
    first `make` had written with the default prefix: pkg-config sent the compiler to
    /usr/local, and a program could not find fabric.h there."""
    prefix = tmp_path / "prefix"
    done = subprocess.run(["make", "-C", str(c_client.root), "install", f"PREFIX={prefix}"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    app = tmp_path / "app.c"
    app.write_text("#include <fabric.h>\nint main(void) { return fabric_err_retriable(8) ? 0 : 1; }\n")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fabric"], capture_output=True, text=True, timeout=30,
                           check=True, env={**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")})
    assert f"-I{prefix}/include" in flags.stdout.split()
    built = subprocess.run(["gcc", str(app), *flags.stdout.split(), "-o", str(tmp_path / "app")],
                           capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(tmp_path / "app")], env={**os.environ, "LD_LIBRARY_PATH": str(prefix / "lib")},
                         timeout=30, check=False)
    assert ran.returncode == 0

"""The C codecs against the shared vectors and the Python codecs, without any network."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fabric.errors import error_table
from fabric.protocol import batch as batch_format
from fabric.protocol.header import decode_header
from tests.interop.conftest import SANITIZE_FLAGS, SDK_C, VECTORS, CClient

pytestmark = pytest.mark.interop

BAD_INPUT_SEED = 20240917  # fixed so CI runs are reproducible; the program prints it
BAD_INPUT_ROUNDS = 20_000


def test_vectors_round_trip_byte_for_byte(c_client: CClient, tmp_path: Path) -> None:
    dump_path = tmp_path / "c_decoded.json"
    run = subprocess.run([str(c_client.test_vectors), str(VECTORS), str(dump_path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "batch_lz4.hex: 176 bytes re-encoded identically" in run.stdout
    decoded: dict[str, Any] = json.loads(dump_path.read_text())

    bodies = json.loads((VECTORS / "bodies.json").read_text())
    for name, entry in bodies.items():
        assert decoded[name] == entry["values"], name

    expected_batch = json.loads((VECTORS / "batch.json").read_text())
    for name in ("batch_none.hex", "batch_lz4.hex"):
        assert decoded[name] == expected_batch, name

    for name in ("header_request.hex", "header_response.hex"):
        header = decode_header(bytes.fromhex((VECTORS / name).read_text().strip()))
        assert decoded[name] == {
            "protocol_version": header.protocol_version,
            "flags": header.flags,
            "api_key": header.api_key,
            "api_version": header.api_version,
            "error_code": header.error_code,
            "correlation_id": header.correlation_id,
        }

    lines = [ln.split() for ln in (VECTORS / "keyhash.txt").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert decoded["keyhash"] == [[k, int(n), c, int(p)] for k, n, c, p in lines]


@pytest.mark.parametrize("codec", [batch_format.CODEC_LZ4, batch_format.CODEC_NONE])
def test_large_python_batch_reencodes_identically(c_client: CClient, tmp_path: Path, codec: int) -> None:
    """Multi-block lz4 frames (records > 64 KiB) and many records, keys, nulls, headers."""
    rng = random.Random(5)
    n = 3000
    keys = [None if i % 11 == 0 else f"key-{rng.randrange(500)}".encode() for i in range(n)]
    values = [None if i % 13 == 0 else rng.randbytes(rng.randrange(0, 200)) for i in range(n)]
    headers = [[("seq", str(i).encode()), ("n", None)] if i % 3 == 0 else [] for i in range(n)]
    timestamps = [1_700_000_000_000 + rng.randrange(-1000, 100_000) for _ in range(n)]
    raw = batch_format.encode_batch(timestamps, keys, values, headers, codec=codec,
                                    base_offset=1234, leader_epoch=5)
    path = tmp_path / "big.hex"
    path.write_text(raw.hex() + "\n")
    run = subprocess.run([str(c_client.test_vectors), "--reencode", str(path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert bytes.fromhex(run.stdout.strip()) == raw


def test_error_table_matches_python(c_client: CClient) -> None:
    run = subprocess.run([str(c_client.test_vectors), "--errors"], capture_output=True, text=True,
                         timeout=30, check=True)
    c_rows = {int(code): (name, retriable == "1")
              for code, name, retriable in (line.split() for line in run.stdout.splitlines())}
    for code, name, retriable, _cls, _description in error_table():
        assert c_rows[code] == (name, retriable), code


def test_bad_input_is_refused_cleanly(c_client: CClient) -> None:
    run = subprocess.run([str(c_client.test_bad_input), str(BAD_INPUT_SEED), str(BAD_INPUT_ROUNDS)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, f"seed={BAD_INPUT_SEED}\n{run.stdout}\n{run.stderr}"
    assert "bad-input checks passed" in run.stdout


def test_bad_api_arguments_are_refused_cleanly(c_client: CClient) -> None:
    """NULL pointers, a header array NULL with a count (it crashed), non-UTF-8 header names
    (the node would refuse the whole batch): INVALID_ARGUMENT at once, offline."""
    run = subprocess.run([str(c_client.test_api_args)], capture_output=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stdout.decode() + run.stderr.decode()
    assert b"API argument checks passed" in run.stdout


SANITIZE_CHECK_TIMEOUT_S = 300
_SANITIZER_PROBE = "#include <stdlib.h>\nint main(void) { free(malloc(1)); return 0; }\n"


def _sanitizer_runtimes_missing(tmp_path: Path) -> str | None:
    """Why gcc cannot build and run an ASan+UBSan program here, or None when it can."""
    source, binary = tmp_path / "probe.c", tmp_path / "probe"
    source.write_text(_SANITIZER_PROBE)
    built = subprocess.run(["gcc", *SANITIZE_FLAGS, str(source), "-o", str(binary)], capture_output=True,
                           text=True, timeout=60, check=False)
    if built.returncode != 0:
        return "gcc cannot link -fsanitize=address,undefined (libasan/libubsan missing): " + built.stderr.strip()[-300:]
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60, check=False)
    if ran.returncode != 0:  # e.g. a kernel or container the ASan runtime cannot map its shadow in
        return "an ASan program cannot run here: " + ran.stderr.strip()[-300:]
    return None


def test_offline_tests_pass_under_asan_and_ubsan(c_client: CClient, tmp_path: Path) -> None:
    """`make sanitize-check`: the vectors, the hostile-input run and the API argument checks
    built with AddressSanitizer + UndefinedBehaviorSanitizer (over-reads, use after free,
    leaks, signed overflow), with the CI seed. It found signed overflows in the batch
    decoder and the batch builder that the normal build ran through silently."""
    missing = _sanitizer_runtimes_missing(tmp_path)
    if missing is not None:
        pytest.skip(missing)
    run = subprocess.run(["make", "-C", str(SDK_C), "-j2", "sanitize-check",
                          f"BAD_INPUT_ARGS={BAD_INPUT_SEED} {BAD_INPUT_ROUNDS}"],
                         capture_output=True, text=True, timeout=SANITIZE_CHECK_TIMEOUT_S, check=False)
    assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    assert "bad-input checks passed" in run.stdout
    assert "API argument checks passed" in run.stdout

"""Replay the fuzz regression vectors: each decodes to a value or a FabricError, within memory.

The vectors are in tests/vectors/fuzz (see its README); the targets are the ones the
coverage-guided fuzzer runs (tests/fuzz/targets.py), so no fuzzing library is needed here.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from tests.fuzz import targets

VECTORS = sorted((Path(__file__).parents[1] / "vectors" / "fuzz").glob("*.bin"))
# A decoder may allocate its output (bounded by lz4's expansion of the input) plus a small
# constant; anything near BATCH_UNCOMPRESSED_BYTES_MAX for a tiny input is the bug class
# this guards against.
ALLOCATION_BYTES_PER_INPUT_BYTE = 300
ALLOCATION_BYTES_BASE = 1 << 20


def test_there_are_vectors_for_every_target() -> None:
    assert {path.name.split("-")[0] for path in VECTORS} == set(targets.TARGETS)


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.name)
def test_vector_decodes_or_raises_fabric_error_within_memory(path: Path) -> None:
    data = path.read_bytes()
    target = targets.TARGETS[path.name.split("-")[0]]
    tracemalloc.start()
    try:
        target(data)  # raises anything that is not a FabricError
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes <= ALLOCATION_BYTES_BASE + ALLOCATION_BYTES_PER_INPUT_BYTE * len(data), peak_bytes


def test_seeds_are_valid_inputs() -> None:
    """The seeds the fuzzer starts from reach the decoders' success paths (else fuzzing
    would only ever explore the first length check)."""
    from fabric.protocol import apis, batch, direct, queues
    from fabric.protocol import groups as group_format
    from fabric.protocol import schema as s

    for seed in targets.seeds("body"):
        s.decode(targets.SCHEMA_ENTRIES[seed[0]][1], seed[1:])
    for seed in targets.seeds("request"):
        apis.decode_request(targets.split_frames(seed))
    for seed in targets.seeds("response"):
        apis.decode_response(targets.split_frames(seed))
    for seed in targets.seeds("batch"):
        batch.decode_batch(seed[1:])
    for seed in targets.seeds("direct"):
        direct.decode_message(targets.split_frames(seed[1:]), published=bool(seed[0] & 1))
    for seed in targets.seeds("state_record"):
        frames = targets.split_frames(seed)
        if len(frames) == 2:
            assert group_format.decode_record(frames[0], frames[1]) is not None
        else:
            queues.decode_state_record(frames[0])


def test_split_frames_inverts_join_frames() -> None:
    for frames in ([b""], [b"a", b""], [b"header", b"body", b"x" * 1000]):
        assert targets.split_frames(targets.join_frames(frames)) == frames

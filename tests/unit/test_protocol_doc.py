"""docs/PROTOCOL.md is enough to write a client: its inline hex vectors are the committed
vector files, and its limits table quotes the values the code enforces."""

from __future__ import annotations

import re
from pathlib import Path

from fabric import limits

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "PROTOCOL.md").read_text()
VECTORS = ROOT / "tests" / "vectors"

_VECTOR = re.compile(r"\*\*`([a-z0-9_]+\.hex)`\*\*[^\n]*\n\n```\n([0-9a-f \n]+)```")


def section(number: int) -> str:
    start = DOC.index(f"\n## {number}. ")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end >= 0 else len(DOC)]


def test_every_vector_file_is_printed_in_the_doc_byte_for_byte() -> None:
    printed = {name: "".join(text.split()) for name, text in _VECTOR.findall(section(9))}
    on_disk = {path.name: "".join(path.read_text().split()) for path in VECTORS.glob("*.hex")}
    assert on_disk, "no vector files found"
    missing = sorted(set(on_disk) - set(printed))
    assert not missing, f"vectors missing from docs/PROTOCOL.md section 9: {missing}; run python3 -m tests.vectors.doc"
    assert printed == on_disk, "run python3 -m tests.vectors.doc"


def test_key_hash_vectors_are_printed() -> None:
    lines = [line for line in (VECTORS / "keyhash.txt").read_text().splitlines() if not line.startswith("#")]
    block = section(9).split("### 9.5", 1)[1]
    for line in lines:
        assert f"\n{line}\n" in block


def test_limits_table_quotes_the_enforced_values() -> None:
    rows = [line for line in section(11).splitlines() if line.startswith("| ")]
    quoted = 0
    for row in rows:
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row):
            value = getattr(limits, name, None)
            if not isinstance(value, int):
                continue
            forms = {f"{value:,}", str(value)}
            if value % (1 << 20) == 0:
                forms.add(f"{value >> 20} MiB")
            assert any(form in row for form in forms), f"{name}={value} not in: {row}"
            quoted += 1
    assert quoted >= 12


def test_error_shapes_name_where_each_kind_of_refusal_goes() -> None:
    shapes = section(12)
    for name in ("MALFORMED_REQUEST", "INVALID_REQUEST", "NOT_CONTROLLER", "UNKNOWN_SERVER_ERROR", "TOPIC_ALREADY_EXISTS"):
        assert f"`{name}`" in shapes

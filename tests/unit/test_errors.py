"""The error table in docs/PROTOCOL.md is the one in fabric/errors.py."""

from __future__ import annotations

import re
from pathlib import Path

from fabric import errors


def test_protocol_doc_table_matches_code() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "PROTOCOL.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([A-Z_]+) \| (yes|no) \| (\S+) \| (.+) \|$", doc, re.M)
    from_doc = [(int(c), n, r == "yes", cls, d) for c, n, r, cls, d in rows]
    assert from_doc == errors.error_table()


def test_codes_map_to_classes() -> None:
    assert errors.error_for_code(8) is errors.NotLeaderError
    assert errors.NotLeaderError.retriable and not errors.CorruptMessageError.retriable
    assert errors.error_for_code(12345) is errors.UnknownServerError
    exc = errors.MessageTooLargeError("too big", batch_bytes=10, limit_bytes=5)
    assert exc.batch_bytes == 10 and "MESSAGE_TOO_LARGE" in str(exc)  # type: ignore[attr-defined]

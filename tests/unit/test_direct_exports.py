"""docs/DIRECT.md's error table names exceptions "exported by sdk and sdk.direct": each one
must be there, and be the fabric.errors class (one class per error, whatever the import)."""

from __future__ import annotations

import re
from pathlib import Path

import sdk
import sdk.direct
from fabric import errors

DIRECT_MD = Path(__file__).resolve().parents[2] / "docs" / "DIRECT.md"


def _error_table_names() -> list[str]:
    text = DIRECT_MD.read_text()
    section = text[text.index("## Errors"):text.index("## Command line")]
    names: list[str] = []
    for line in section.splitlines():
        if line.startswith("| `"):
            names += re.findall(r"`(\w+)`", line.split("|")[1])
    return names


def test_every_error_the_direct_doc_names_is_exported_by_sdk_and_sdk_direct() -> None:
    names = _error_table_names()
    assert len(names) >= 11 and "ServiceStopping" in names and "AuthenticationFailedError" in names
    for name in names:
        cls = getattr(errors, name)
        assert getattr(sdk, name) is cls, name
        assert getattr(sdk.direct, name) is cls, name
        assert name in sdk.__all__ and name in sdk.direct.__all__, name

"""Topic configs as a user writes them (CLI ``-c key=value``, Admin ``config=``): strings in,
checked values out, every refusal naming the key (fabric/zk.py ``TopicConfig.build``)."""

from __future__ import annotations

import pytest

from fabric import errors
from fabric.zk import TopicConfig


@pytest.mark.parametrize("raw, value", [("2048", 2048), ("-1", -1), ("007", 7)])
def test_decimal_integers_are_taken(raw: str, value: int) -> None:
    assert TopicConfig.build(1, 1, {"retention_ms": raw}, 0).retention_ms == value


@pytest.mark.parametrize("raw", [" 2048", "2048 ", "1_000", "+5", "0x10", "1e3", "12.0", "", "٣", "2048\n"])
def test_anything_else_is_refused_by_name(raw: str) -> None:
    # int() would take several of these; describe would then show a value the user did not write.
    with pytest.raises(errors.InvalidConfigError, match="retention_ms must be a decimal integer"):
        TopicConfig.build(1, 1, {"retention_ms": raw}, 0)


def test_integers_past_the_i64_are_refused() -> None:
    """A 40-digit retention_ms was accepted and shown back by describe; clients read configs as i64."""
    with pytest.raises(errors.InvalidConfigError, match="does not fit a 64-bit integer"):
        TopicConfig.build(1, 1, {"retention_ms": "9" * 40}, 0)
    assert TopicConfig.build(1, 1, {"retention_ms": str((1 << 63) - 1)}, 0).retention_ms == (1 << 63) - 1


def test_unknown_keys_and_booleans_keep_their_own_errors() -> None:
    with pytest.raises(errors.InvalidConfigError, match="unknown topic config 'retention'"):
        TopicConfig.build(1, 1, {"retention": "1"}, 0)
    with pytest.raises(errors.InvalidConfigError, match="strict_order must be true or false"):
        TopicConfig.build(1, 1, {"strict_order": "yes"}, 0)
    assert TopicConfig.build(1, 1, {"strict_order": "TRUE"}, 0).strict_order is True

"""OrderedConsumer refuses consumer options it cannot honour, before it opens a socket."""

from __future__ import annotations

from typing import Any

import pytest

from sdk import OrderedConsumer


@pytest.mark.parametrize("option", ["group_id", "group_instance_id", "tag_filter"])
def test_group_and_tag_filter_options_are_refused_up_front(option: str) -> None:
    # A group_id was taken and ignored (nothing joined, nothing committed: a restarted
    # reader started over), and a tag_filter failed only at the first poll, naming poll().
    with pytest.raises(ValueError, match=f"takes no {option}"):
        options: dict[str, Any] = {option: "x"}
        OrderedConsumer("tcp://127.0.0.1:1", "ledger", **options)

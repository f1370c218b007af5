"""The public Producer is a thin handle over _ProducerCore: the two must take the same options."""

from __future__ import annotations

import inspect

from sdk.producer import Producer, _ProducerCore


def test_handle_and_core_take_the_same_parameters() -> None:
    handle = inspect.signature(Producer.__init__).parameters
    core = inspect.signature(_ProducerCore.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in handle.values()] == \
        [(p.name, p.kind, p.default) for p in core.values()]

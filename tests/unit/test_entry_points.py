"""The two entry points (``sdk.connect``'s AsyncClient, ``sdk.Client``) offer every call of
the direct plane's clients under the same name: docs/DIRECT.md shows them on either (an
audit found ``client.start_publisher()`` documented there and missing from both)."""

from __future__ import annotations

import inspect

import sdk
from sdk.aio import AsyncClient
from sdk.direct import DirectClient
from sdk.direct._sync import SyncDirect


def _calls(cls: type) -> set[str]:
    return {name for name, value in inspect.getmembers(cls) if not name.startswith("_") and callable(value)}


def test_the_blocking_client_forwards_every_direct_call() -> None:
    assert _calls(SyncDirect) - _calls(sdk.Client) == set()


def test_the_asyncio_client_forwards_every_direct_call() -> None:
    # connect is DirectClient's constructor; instances and publisher are views of its own state.
    assert _calls(DirectClient) - _calls(AsyncClient) - {"connect", "instances", "publisher"} == set()

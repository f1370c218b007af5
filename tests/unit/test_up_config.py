"""``fabric up --config node.toml``: what the file says reaches the cluster it starts. No
cluster: LocalCluster is replaced by a stand-in that records how it was made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fabric.local
from fabric.cli import build_parser
from fabric.cli.cluster import cmd_up


class _Made(Exception):
    pass


def _cluster_kwargs(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    made: dict[str, Any] = {}

    def stand_in(*args: Any, **kwargs: Any) -> None:
        made.update(kwargs)
        raise _Made

    monkeypatch.setattr(fabric.local, "LocalCluster", stand_in)
    args, _rest = build_parser().parse_known_args(["up", *argv])
    with pytest.raises(_Made):
        cmd_up(args)
    return made


def test_the_files_session_timeout_is_the_clusters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # LocalCluster passes --session-timeout-ms to every node, and a flag wins over the
    # file: the file's value was ignored without a word.
    monkeypatch.delenv("FABRIC_NODE_SESSION_TIMEOUT_MS", raising=False)
    config = tmp_path / "node.toml"
    config.write_text("session_timeout_ms = 9000\n")
    assert _cluster_kwargs(["--config", str(config)], monkeypatch)["session_timeout_ms"] == 9000
    assert _cluster_kwargs([], monkeypatch)["session_timeout_ms"] == 6000  # the default, as before

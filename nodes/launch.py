"""The storage node's entry point (``python -m nodes``, ``fabric node``): options from
flags, environment and a TOML file (``fabric.config``), one logging setup
(``fabric.logs``), then the node itself."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from fabric import config, logs
from fabric.errors import ConfigError

# Options this entry point consumes itself rather than passing to the node's own parser.
_CONSUMED_HERE = ("log_format",)


def server_argv(settings: dict[str, Any]) -> list[str]:
    """The resolved settings as explicit flags for ``nodes.server.main``: every value is
    spelled out, so the node's own defaults never override a file or the environment."""
    argv: list[str] = []
    for option in config.NODE_OPTIONS:
        if option.name not in _CONSUMED_HERE:
            argv += [option.flag, str(settings[option.name])]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = config.load_node_settings(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"fabric node: error: {exc.message}", file=sys.stderr)
        return 2
    logs.setup(settings["log_level"], settings["log_format"], process=f"node{settings['id']}",
               node_id=settings["id"])
    from nodes.server import main as server_main

    return server_main(server_argv(settings))

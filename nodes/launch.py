"""The storage node's entry point (``python -m nodes``, ``fabric node``): options from
flags, environment and a TOML file (``fabric.config``), one logging setup
(``fabric.logs``), then the node itself."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

from fabric import config, logs
from fabric.errors import ConfigError

# Options this entry point consumes itself rather than passing to the node's own parser.
_CONSUMED_HERE = ("log_format",)


def server_argv(settings: dict[str, Any]) -> list[str]:
    """The resolved settings as explicit flags for ``server_main``: every value is
    spelled out, so the node's own defaults never override a file or the environment."""
    argv: list[str] = []
    for option in config.NODE_OPTIONS:
        if option.name not in _CONSUMED_HERE:
            argv += [option.flag, str(settings[option.name])]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, sources = config.resolve_node_settings(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        usage = exc.fields.get("usage")
        if usage:  # a flag argparse refused: the usage line first, as argparse prints it
            print(usage, file=sys.stderr)
        print(f"fabric node: error: {exc.message}", file=sys.stderr)
        return 2
    logs.setup(settings["log_level"], settings["log_format"], process=f"node{settings['id']}",
               node_id=settings["id"])
    # First thing in the log: what this node runs with and why (flag, environment, file or
    # default), so an operator need not reconstruct four sources from a unit file.
    logging.getLogger("fabric.node").info("%s", config.effective_config_line(settings, sources))
    return server_main(server_argv(settings))


def server_main(argv: list[str] | None = None) -> int:
    """Build the node, start it (ZooKeeper, registration, roles), then serve until stopped.
    A node that cannot start says why in one line and exits 1; a storage failure, while
    starting or serving, exits 74 (``nodes/storage_failure.py``)."""
    import logging
    import os
    import signal

    import zmq
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    from fabric import errors
    from nodes import drain, session, storage_failure
    from nodes.server import Node
    from nodes.state import parse_node_args

    config, log_level = parse_node_args(argv)
    logging.basicConfig(level=log_level, format=f"%(asctime)s node{config.node_id} %(levelname)s %(message)s")
    # While starting (ZooKeeper may take its 30 s to answer, or never), SIGINT and SIGTERM
    # end the start at once; the serving node's own handlers (a drain) come after it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        node = Node(config)
        node.start()
    except KeyboardInterrupt:
        print(f"fabric node: node {config.node_id}: start interrupted", file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(130)  # as below: half-made sockets and ZooKeeper threads must not hang the exit
    except (errors.FabricError, OSError, zmq.ZMQError, KazooException, KazooTimeoutError) as exc:
        # One line, not a traceback: a port in use, a data dir that is a file, key files
        # missing, ZooKeeper not answering. os._exit: sockets, the store and ZooKeeper's
        # threads may be half made, and closing them must not hang the exit.
        what = exc.message if isinstance(exc, errors.FabricError) else (str(exc) or type(exc).__name__)
        if isinstance(exc, KazooTimeoutError):
            what = f"ZooKeeper at {config.zk} did not answer within {session.ZK_START_TIMEOUT_S:.0f} s"
        print(f"fabric node: error: node {config.node_id} cannot start: {what}", file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(storage_failure.EXIT_STORAGE_FAILED if isinstance(exc, errors.StorageError) else 1)
    drain.install_signals(node.state, node.stop)  # SIGTERM: a controlled shutdown
    try:
        node.run()
    except errors.StorageError as exc:  # the node stopped, having written nothing more: one line says why
        logging.getLogger("fabric.node").critical("%s", storage_failure.stop_line(config.node_id, exc))
        logging.shutdown()
        os._exit(storage_failure.EXIT_STORAGE_FAILED)  # as above: threads must not hang the exit
    return 0

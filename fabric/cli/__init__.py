"""The ``fabric`` command line: the top layer, which may import every package.

    fabric up                      local cluster: ZooKeeper + 3 nodes, until Ctrl-C
    fabric demo                    the quickstart job: cluster, 100,000+ messages, summary
    fabric node --id N --zk ...    one storage node
    fabric sequencer --zk ... --id N   one sequencer instance (strict-order topics)
    fabric topic create|list|describe|delete
    fabric produce TOPIC           lines from stdin or --file
    fabric consume TOPIC           records to stdout (--follow to keep going)
    fabric bench                   the produce/consume benchmark (python -m bench)
    fabric keys|principal|acl      CURVE keys, principals, access rules (docs/SECURITY.md)

Commands that talk to a cluster take ``--bootstrap`` (``zk://host:port`` or node
addresses); without it they use ``$FABRIC_BOOTSTRAP`` or the cluster that ``fabric up``
recorded in ``~/.fabric/local.json``.

Adding a command group: write ``fabric/cli/<group>.py`` with
``register(subparsers) -> None``, which adds its sub-parser(s) and sets either
``run=handler`` (``handler(args: Namespace) -> int``) or, for a command that parses its
own arguments, ``run_argv=handler`` (``handler(argv: list[str]) -> int``); then add the
module to ``COMMAND_GROUPS`` below. Nothing else changes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from types import ModuleType

from fabric import errors
from fabric.cli import bench, cluster, consume, produce, security, sequencer, status, topic

# The registry: one line per command group, in the order ``fabric --help`` lists them.
COMMAND_GROUPS: tuple[ModuleType, ...] = (
    cluster,
    topic,
    produce,
    consume,
    bench,
    status,
    sequencer,
    security,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fabric", description="Fabric messaging: local cluster, topics, produce, consume.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    # parse_known_args, so a pass-through command (node, bench) receives its own
    # arguments, --help included; every other command still refuses unknown ones.
    args, rest = parser.parse_known_args(argv)
    run_argv: Callable[[list[str]], int] | None = getattr(args, "run_argv", None)
    if run_argv is not None:
        return run_argv(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except errors.FabricError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

"""``fabric sequencer --zk HOST:PORT [--id N]``: run one sequencer instance.

Run two or more; one is active (``sequencer/service.py``). The instance parses its own
arguments (it is also ``python -m sequencer``), so they pass straight through.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("sequencer", help="run one sequencer instance (see fabric sequencer --help)",
                                   add_help=False, keeps_unknown=True)
    parser.set_defaults(run_argv=cmd_sequencer)


def cmd_sequencer(argv: list[str]) -> int:
    from sequencer.service import main as sequencer_main

    return sequencer_main(argv)

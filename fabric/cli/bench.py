"""``fabric bench``: the produce/consume benchmark (the same as ``python -m bench``)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # The benchmark parses its own arguments: pass them through.
    bench = subparsers.add_parser("bench", help="run the benchmark (see fabric bench --help)", add_help=False,
                                  keeps_unknown=True)
    bench.set_defaults(run_argv=cmd_bench)


def cmd_bench(argv: list[str]) -> int:
    if "--peers" in argv:  # fabric bench --peers [...]: the side-by-side benchmark (python -m bench.peers)
        from bench.peers import main as peers_main

        return peers_main([a for a in argv if a != "--peers"], prog="fabric bench --peers")
    from bench.__main__ import main as bench_main

    return bench_main(argv, prog="fabric bench")

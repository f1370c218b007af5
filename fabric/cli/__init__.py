"""The ``fabric`` command line: the top layer, which may import every package.

    fabric up                      local cluster: ZooKeeper + 3 nodes, until Ctrl-C
    fabric demo                    the quickstart job: cluster, 200,000 messages, summary
    fabric node --id N --zk ...    one storage node
    fabric sequencer --zk ... --id N   one sequencer instance (strict-order topics)
    fabric topic create|list|describe|delete
    fabric produce TOPIC           lines from stdin or --file
    fabric consume TOPIC           records to stdout (--follow to keep going, --group G to join a group)
    fabric service list            direct-plane services and their instances
    fabric request NAME PAYLOAD    one direct-plane request (also: subscribe, publish)
    fabric group list|describe|reset-offsets|delete   consumer groups
    fabric queue create|list|describe|delete|redrive|send|receive   work queues (docs/QUEUES.md)
    fabric bench                   the produce/consume benchmark (python -m bench)
    fabric keys|principal|acl|quota  CURVE keys, principals, access rules, quotas (docs/SECURITY.md)

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

import contextlib
import os
import signal
import sys
from types import FrameType
from typing import Any

EXIT_INTERRUPTED_EARLY = 130  # EXIT_INTERRUPTED, before _common (which defines it) is imported


def _exit_interrupted(_signum: int, _frame: FrameType | None) -> None:
    # os._exit, not an exception: a KeyboardInterrupt or SystemExit raised while the
    # compiler or an import runs can be lost in C code (seen: the command then ran on and
    # exited 0). Nothing has been written yet, so nothing is lost by not unwinding.
    os._exit(EXIT_INTERRUPTED_EARLY)


def _started_as_fabric() -> bool:
    """Whether this process is the ``fabric`` command (``python -m fabric``, ``python -m
    fabric.cli`` or the console script), not a program that imports the CLI (pytest)."""
    program = sys.modules.get("__main__")
    spec = getattr(program, "__spec__", None)
    if spec is not None:
        return spec.name in ("fabric.__main__", "fabric.cli.__main__")
    return os.path.basename(getattr(program, "__file__", None) or "") == "fabric"


# Ctrl-C while the imports below run (a tenth of a second of every command's start) would
# otherwise print a KeyboardInterrupt traceback from deep inside some library: exit 130
# quietly instead, as main() does later. Only in place of Python's own handler (a SIGINT
# the shell ignores stays ignored), and handed back once the imports are done.
_SIGINT_AT_IMPORT = signal.getsignal(signal.SIGINT)
_QUIET_IMPORT = _SIGINT_AT_IMPORT is signal.default_int_handler and _started_as_fabric()
if _QUIET_IMPORT:
    try:
        signal.signal(signal.SIGINT, _exit_interrupted)
    except ValueError:  # imported from a thread other than the main one: signals are not ours
        _QUIET_IMPORT = False

import argparse  # noqa: E402 (after the handler, on purpose)
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from types import ModuleType  # noqa: E402

from fabric import __version__, errors  # noqa: E402
from fabric.cli import (  # noqa: E402
    bench,
    cluster,
    consume,
    group,
    produce,
    queue,
    security,
    sequencer,
    service,
    status,
    topic,
)
from fabric.cli._common import (  # noqa: E402
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    CliError,
    Parser,
    one_line,
    quiet_libraries,
)

if _QUIET_IMPORT:
    signal.signal(signal.SIGINT, _SIGINT_AT_IMPORT)


def _lost_interrupt(unraisable: Any) -> None:
    """Python drops an exception raised inside a callback it runs for itself (an import's
    module-lock cleanup is one) with "Exception ignored in ...": a Ctrl-C landing there,
    while a command's own imports run, was lost, and the command ran on until it failed
    (exit 1, CI saw it). Such a KeyboardInterrupt ends the command with 130 instead."""
    if isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, KeyboardInterrupt):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_INTERRUPTED_EARLY)
    _UNRAISABLE_HOOK(unraisable)


_UNRAISABLE_HOOK = sys.unraisablehook
if _started_as_fabric():
    sys.unraisablehook = _lost_interrupt

# The registry: one line per command group, in the order ``fabric --help`` lists them.
COMMAND_GROUPS: tuple[ModuleType, ...] = (
    cluster,
    topic,
    produce,
    consume,
    service,
    group,
    queue,
    bench,
    status,
    sequencer,
    security,
)

EPILOG = """exit codes: 0 success, 1 error from the cluster or the environment, 2 usage error,
3 partial (`produce`: some records delivered, some not; `status`: ZooKeeper did not answer),
130 interrupted, 143 stopped by SIGTERM.
FABRIC_DEBUG=1 shows tracebacks and the client libraries' log messages."""


def build_parser() -> argparse.ArgumentParser:
    # keeps_unknown: a pass-through command's arguments come back from parse_known_args.
    parser = Parser(prog="fabric", description="Fabric messaging: local cluster, topics, produce, consume.",
                    epilog=EPILOG, keeps_unknown=True)
    parser.add_argument("--version", action="version", version=f"fabric {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMAND_GROUPS:
        module.register(subparsers)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so it stops as on Ctrl-C."""


_terminated = False


def _terminate(_signum: int, _frame: FrameType | None) -> None:
    global _terminated
    _terminated = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise _Terminated


def _stop_cleanly_on_sigterm() -> None:
    """SIGTERM (``kill``, systemd, ``docker stop``, ``timeout``) stops a command as Ctrl-C
    does, unwinding it and closing its clients: ``fabric consume --group`` commits what it
    printed and leaves its group, instead of the member staying in the group until its
    session ends (45 s) as it did when SIGTERM killed the process outright (Kafka's console
    tools close their clients on SIGTERM too). Exit status 143. Only for the ``fabric``
    command, and only where SIGTERM has its default action; ``fabric up`` installs its own
    handler over this one, and ``fabric node``, ``fabric sequencer`` and ``fabric bench``,
    which parse their own arguments, never get it."""
    if not _started_as_fabric():
        return
    with contextlib.suppress(ValueError):  # not the main thread: signals are not ours
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminate)


def main(argv: list[str] | None = None) -> int:
    """The ``fabric`` command: an exit code, never a traceback (not even for Ctrl-C while
    arguments are parsed or a command's own imports run)."""
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    return EXIT_TERMINATED if _terminated and code == EXIT_INTERRUPTED else code


def bootstrap_after_the_command(argv: list[str]) -> list[str]:
    """``fabric --bootstrap zk://... topic list`` as ``fabric topic list --bootstrap zk://...``:
    the address given before the command, as NATS's ``nats -s URL sub x`` takes its server,
    goes to the command (which refuses it if it takes none). Before, argparse took the
    address for the command's name ("invalid choice: 'zk://...'")."""
    moved: list[str] = []
    rest = list(argv)
    while rest:
        head = rest[0]
        if head in ("--bootstrap", "-b") and len(rest) >= 2:
            moved += rest[:2]
            del rest[:2]
        elif head.startswith("--bootstrap=") or (head.startswith("-b") and not head.startswith("--") and len(head) > 2):
            moved.append(head)
            del rest[0]
        else:
            break
    if not moved or not rest:  # no command after it: argparse says a COMMAND is required
        return rest
    end = rest.index("--") if "--" in rest else len(rest)  # after `--` everything is positional
    return rest[:end] + moved + rest[end:]


def _main(argv: list[str]) -> int:
    argv = bootstrap_after_the_command(argv)
    parser = build_parser()
    # parse_known_args, so a pass-through command (node, bench) receives its own
    # arguments, --help included; every other command refuses unknown ones while parsing
    # (Parser.parse_known_args), naming itself.
    args, rest = parser.parse_known_args(argv)
    run_argv: Callable[[list[str]], int] | None = getattr(args, "run_argv", None)
    if run_argv is not None:
        return run_argv(rest)
    if rest:  # only ever the top parser's own: a flag before any command (`fabric --frob topic list`)
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    debug = os.environ.get("FABRIC_DEBUG", "") not in ("", "0")
    quiet_libraries(debug)
    _stop_cleanly_on_sigterm()
    run: Callable[[argparse.Namespace], int] = args.run
    return run_guarded(run, args, debug)


def run_guarded(run: Callable[[argparse.Namespace], int], args: argparse.Namespace, debug: bool) -> int:
    """The one place an exception becomes a message: one line on stderr and an exit code
    (docs/PROTOCOL.md section 13). A traceback only with FABRIC_DEBUG=1."""
    try:
        return run(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`fabric consume t | head`): not an error. Point stdout at
        # /dev/null so the interpreter's final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        if debug:
            traceback.print_exc()
        prefix, message, code = describe_error(exc, args)
        print(f"{prefix}: error: {one_line(message)}", file=sys.stderr)
        return code


def describe_error(exc: Exception, args: argparse.Namespace) -> tuple[str, str, int]:
    """(prefix, message, exit code) for an exception that reached the top. A usage error
    names the command as typed (``fabric queue send: error:``, docs/PROTOCOL.md section 13);
    any other says ``fabric: error:``."""
    # Parser records the deepest command's prog; "fabric" for a namespace not made by it.
    command: str = getattr(args, "command_prog", "fabric")
    if isinstance(exc, CliError):
        return (command if exc.exit_code == EXIT_USAGE else "fabric"), exc.message, exc.exit_code
    if isinstance(exc, errors.ConfigError):  # a bad option value, from a flag or a file named by one
        return command, exc.message, EXIT_USAGE
    if isinstance(exc, UnicodeEncodeError) and exc.reason == "surrogates not allowed":
        # Lone surrogates come from bytes of argv that are not UTF-8 (surrogateescape): an
        # argument without a utf8_text check, still the user's input rather than a bug.
        bad = exc.object[exc.start:exc.end] if isinstance(exc.object, str) else ""
        return command, f"an argument is not valid UTF-8 (near {bad!r})", EXIT_USAGE
    if isinstance(exc, errors.FabricError):
        return "fabric", str(exc), EXIT_ERROR
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return "fabric", f"{exc.strerror or exc}{where}", EXIT_ERROR
    # A bug: still one line, and the way to see more.
    return "fabric", f"internal error {type(exc).__name__}: {exc} (run with FABRIC_DEBUG=1 for the traceback)", EXIT_ERROR

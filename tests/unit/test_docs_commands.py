"""Every complete ``fabric ...`` command the README and docs/ show parses with today's CLI.

A renamed subcommand or flag otherwise leaves the docs telling users to type something that
fails (QUEUES.md once said ``fabric queue status``; the command is ``describe``). Only the
parse is checked here, nothing runs. Commands shown with placeholders (``[--flag]``,
``add/remove``, ``<name>``, ``NAME``, ``...``) and bare references such as "`fabric produce`" (which
stop at a missing required argument) are skipped; pass-through commands (``node``,
``sequencer``, ``bench``) parse their own arguments and are checked by their own tests.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from fabric.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_SPAN = re.compile(r"`((?:python3 -m )?fabric [a-z-][^`]*)`")
_LINE = re.compile(r"^(?:\$ )?((?:python3 -m )?fabric [a-z].*)$")
_PLACEHOLDER = re.compile(r"[\[<]|\.\.\.|\w/\w|\b[A-Z][A-Z_]+\b|\bN\b|=$")
# A line the command prints, quoted in the docs: `fabric topic list: error: ...`.
_OUTPUT = re.compile(r"^(?:python3 -m )?fabric(?: [a-z-]+)*: (?:error|warning):")


def documented_commands() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = line.strip()
            whole = _LINE.match(text)
            for command in [*_SPAN.findall(text), *([whole.group(1)] if whole else [])]:
                # The command itself: before a comment, a pipe, a redirection or a second command.
                command = re.split(r"\s+#|\s*(?:\||&&|;|>|<)\s*", command)[0].strip()
                if _PLACEHOLDER.search(command) or _OUTPUT.match(command):
                    continue
                found.append((f"{path.name}:{number}", command))
    return found


COMMANDS = documented_commands()


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) > 80  # the extraction still finds them


@pytest.mark.parametrize("where, command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_parses(where: str, command: str) -> None:
    try:
        words = shlex.split(command)
    except ValueError:
        pytest.skip("not a shell command (unbalanced quotes in prose)")
    if words[:2] == ["python3", "-m"]:
        words = words[2:]
    parser = build_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            args, rest = parser.parse_known_args(words[1:])
    except SystemExit as exit_:
        message = stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else ""
        if exit_.code == 0 or "arguments are required" in message:
            return  # --help / --version, or a bare reference to a command
        pytest.fail(f"{where}: `{command}` does not parse: {message}")
    if getattr(args, "run_argv", None) is None:
        assert not rest, f"{where}: `{command}`: unrecognized arguments {rest}"
    assert isinstance(args, argparse.Namespace)

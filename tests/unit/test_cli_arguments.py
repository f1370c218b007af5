"""The ``fabric`` command line refuses bad flag values while parsing: one line, exit 2
(docs/PROTOCOL.md section 13), never an "internal error" from an encoder further on. No
cluster: argparse alone, and the pure pieces of the error mapping."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fabric.cli import build_parser, describe_error
from fabric.cli._common import EXIT_ERROR, EXIT_USAGE, CliError
from fabric.cli.produce import _report
from fabric.limits import PARTITIONS_MAX, REPLICATION_FACTOR_MAX

NOT_UTF8 = b"\xff".decode("utf-8", "surrogateescape")  # what Python makes of a non-UTF-8 argv byte


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a usage error (exit 2) for ``argv``."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_known_args(argv)
    assert exit_info.value.code == EXIT_USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fabric ") and ": error: " in lines[0], lines
    return lines[0]


@pytest.mark.parametrize(("argv", "needle"), [
    (["topic", "create", "x", "--partitions", "99999999999999999999"], "PARTITIONS_MAX"),
    (["topic", "create", "x", "--partitions", str(PARTITIONS_MAX + 1)], "PARTITIONS_MAX"),
    (["topic", "create", "x", "--replication-factor", "70000"], "REPLICATION_FACTOR_MAX"),
    (["topic", "create", "x", "-r", str(REPLICATION_FACTOR_MAX + 1)], "REPLICATION_FACTOR_MAX"),
    (["topic", "add-partitions", "t1", "--partitions", "99999999999"], "--partitions"),
    (["topic", "reassign", "t1", "--partition", "0", "--replicas", "99999999999,2,3"], "node ids are i32"),
    (["topic", "reassign", "t1", "--partition", "99999999999", "--replicas", "1,2,3"], "--partition"),
    (["topic", "reassign", "t1", "--partition", "0", "--replicas", "1", "--throttle-bytes-per-s", "1" + "0" * 30],
     "i64"),
    (["topic", "reassign", "t1", "--partition", "0", "--replicas", "1", "--wait", "--timeout", "nan"], "--timeout"),
    # Refused by the controller after connecting (exit 1) before: a cap that slow never finishes.
    (["topic", "reassign", "t1", "--partition", "0", "--replicas", "1", "--throttle-bytes-per-s", "1000"],
     "below 1024 bytes/s"),
    (["queue", "create", "q", "--partitions", "99999999999"], "PARTITIONS_MAX"),
    (["queue", "create", "q", "--replication-factor", "70000"], "REPLICATION_FACTOR_MAX"),
    (["status", "--timeout", "nan"], "not a finite number"),
    (["status", "--timeout", "inf"], "not a finite number"),
    (["status", "--timeout", "0"], "--timeout"),
    (["status", "--timeout", "-1"], "--timeout"),
    (["produce", "t1", "--header", f"{NOT_UTF8}=v"], "--header"),
    (["produce", "t1", "--header", f"n={NOT_UTF8}"], "not valid UTF-8"),
    (["produce", "t1", "--key-sep", NOT_UTF8], "--key-sep"),
    (["produce", "t1", "--key-sep", ""], "must not be empty"),
    (["produce", "t1", "--header", "n" * 70_000 + "=v"], "header name of 70,000 bytes"),
    (["produce", "t1", "--linger-ms", "inf"], "--linger-ms"),
    (["produce", "t1", "--delivery-timeout-ms", "99999999999999"], "--delivery-timeout-ms"),
    (["consume", "t1", "--group", ""], "--group"),
    (["consume", "t1", "--tags", "(("], "--tags"),
    (["consume", "t1", "--tags", "a &&"], "--tags"),
    (["queue", "create", "q", "--max-message-bytes", "10"], "message_bytes_max"),
    (["queue", "create", "q", "--max-message-bytes", str(65 * 1024 * 1024)], "message_bytes_max"),
    (["consume", "t1", "--group", "a/b"], "--group"),
    (["group", "describe", ""], "group id"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to", "earliest", "--partition", "99999999999"], "--partition"),
    (["subscribe", "a.*", "--max-messages", "-1"], "--max-messages"),
    (["publish", "a.b", "x", "--wait-ms", "-1"], "--wait-ms"),
    (["request", "svc", NOT_UTF8], "not valid UTF-8"),
    # Each was refused only after connecting (exit 1), or not at all.
    (["consume", "t1", "--partition", "99999999999999"], "PARTITIONS_MAX"),  # was "internal error ValueError"
    (["produce", "t1", "--partition", "99999999999"], "PARTITIONS_MAX"),
    (["request", "svc", "hi", "--header", "novalue"], "--header: 'novalue' is not NAME=VALUE"),
    (["request", "svc", "hi", "--timeout-ms", "99999999999999"], "TIMEOUT_MS_MAX"),
    (["subscribe", "a..b"], "has an empty token"),
    (["subscribe", "a.b", "--timeout-ms", "99999999999999"], "TIMEOUT_MS_MAX"),
    (["publish", "a.*", "x"], "wildcards belong in patterns"),
    (["publish", "", "x"], "must be 1 to 255 bytes"),
    (["quota", "set", "bob", "--produce-bytes-per-s", "0"], "--produce-bytes-per-s"),
    (["quota", "set", "bob", "--produce-bytes-per-s", "-5"], "--produce-bytes-per-s"),
    (["topic", "reassign", "t1", "--generate", "1,1,1"], "node 1 appears twice in '1,1,1'"),  # planned [1, 1, 1]
    (["topic", "reassign", "t1", "--partition", "0", "--replicas", "1,2,1"], "node 1 appears twice"),
    (["demo", "--size", "10"], "24-digit sequence number"),  # sent 24 bytes, reported 10
    (["keys", "generate", "bad name"], "key name 'bad name'"),  # was exit 1, after the command started
    (["principal", "add", "a/b", "--key", "x.key"], "principal name 'a/b'"),
    # Every bound of a queue send is a constant of fabric/protocol/queues.py: a delay and a
    # dedup id out of theirs were refused by the SDK after connecting (exit 1), while
    # --priority 10 and --ttl-ms -1 were usage errors.
    (["queue", "send", "q", "-m", "x", "--delay-ms", "604800001"], "DELAY_MS_MAX"),
    (["queue", "send", "q", "-m", "x", "--delay-ms", "-1"], "DELAY_MS_MAX"),
    (["queue", "send", "q", "-m", "x", "--dedup-id", "d" * 129], "DEDUP_ID_BYTES_MAX"),
    (["queue", "send", "q", "-m", "x", "--dedup-id", "é" * 65], "130 bytes of UTF-8"),
    (["queue", "send", "q", "-m", "x", "--dedup-id", NOT_UTF8], "not valid UTF-8"),
    (["queue", "send", "q", "-m", "x", "--priority", "10"], "--priority"),
    (["queue", "send", "q", "-m", "x", "--ttl-ms", "-1"], "--ttl-ms"),
])
def test_bad_values_are_refused_while_parsing(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert needle in refused(argv, capsys)


def test_node_drain_refuses_a_node_id_wider_than_i32(capsys: pytest.CaptureFixture[str]) -> None:
    from fabric.cli.cluster import cmd_node_drain

    with pytest.raises(SystemExit) as exit_info:
        cmd_node_drain(["99999999999"])
    assert exit_info.value.code == EXIT_USAGE and "node ids are i32" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "attribute", "value"), [
    (["topic", "create", "x", "--partitions", str(PARTITIONS_MAX), "-r", str(REPLICATION_FACTOR_MAX)],
     "partitions", PARTITIONS_MAX),
    (["topic", "reassign", "t1", "--partition", "0", "--replicas", "0,2147483647"], "replicas", [0, 2**31 - 1]),
    (["status", "--timeout", "0.5"], "timeout", 0.5),
    (["produce", "t1", "--header", "n" * 65_535 + "=v", "--key-sep", "é"], "key_sep", "é"),
    (["consume", "t1", "--group", "billing-1"], "group", "billing-1"),
    (["queue", "send", "q", "--delay-ms", "604800000"], "delay_ms", 604_800_000),
    (["queue", "send", "q", "--dedup-id", "é" * 64], "dedup_id", "é" * 64),  # 128 bytes
])
def test_the_edges_of_each_range_are_accepted(argv: list[str], attribute: str, value: object) -> None:
    args, rest = build_parser().parse_known_args(argv)
    assert rest == [] and getattr(args, attribute) == value


def test_an_argument_that_is_not_utf8_is_a_usage_error_wherever_it_fails() -> None:
    # The safety net for an argument without a utf8_text check: its .encode() fails.
    try:
        f"topic-{NOT_UTF8}".encode()
    except UnicodeEncodeError as exc:
        prefix, message, code = describe_error(exc, argparse.Namespace(command_prog="fabric topic create"))
    assert (prefix, code) == ("fabric topic create", EXIT_USAGE) and "not valid UTF-8" in message


def test_a_bug_is_still_an_internal_error() -> None:
    prefix, message, code = describe_error(ValueError("boom"), argparse.Namespace(command_prog="fabric topic create"))
    assert (prefix, code) == ("fabric", EXIT_ERROR) and message.startswith("internal error ValueError")


def test_a_record_the_sdk_refuses_before_anything_was_delivered_is_a_usage_error() -> None:
    # cmd_produce turns a ValueError/TypeError from Producer.send into this stop.
    stopped = CliError("header name of 70000 bytes: at most 65535", EXIT_USAGE)
    with pytest.raises(CliError) as error:
        _report(0, 0, [], stopped)
    assert error.value.exit_code == EXIT_USAGE and "0 of 0 records delivered" in error.value.message


def _flags(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _flags(sub, f"{prog} {name}")
        elif action.option_strings:
            out.append((prog, action))
    return out


def test_every_flag_with_a_default_shows_it_in_help() -> None:
    """PROTOCOL.md 13: `fabric COMMAND --help` shows every flag with its default. argparse
    prints no default for a flag without help text: `fabric request --timeout-ms` (5000),
    `fabric queue receive --group` (default) and `fabric demo --messages` showed none."""
    missing = [f"{prog} {action.option_strings[0]}" for prog, action in _flags(build_parser(), "fabric")
               if action.default not in (None, False, argparse.SUPPRESS) and not (action.help or "").strip()]
    assert missing == []


def test_the_sequencer_shows_its_defaults_and_refuses_a_bad_flag_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`fabric sequencer` parses its own flags: its usage errors printed the whole usage
    block before the error line, and its --help no default (OPERATIONS.md states them)."""
    from sequencer.service import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--zk", "127.0.0.1:2181", "--port", "x"])
    assert exit_info.value.code == EXIT_USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fabric sequencer: error: "), lines
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 1)", "(default: 127.0.0.1)", "(default: 6000)", "(default: 0)"):
        assert default in help_text


def test_a_bare_key_file_name_is_found_where_keys_generate_wrote_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SECURITY.md and `fabric up --secure`: `fabric keys generate alice`, then `fabric
    principal add alice --key alice.key`. generate writes into ~/.fabric/keys, so the
    second command failed with "key file alice.key does not exist" from any other
    directory."""
    from fabric.auth import keys
    from fabric.cli.security import key_argument

    key_dir = tmp_path / "keys"
    keys.generate_key_pair(key_dir, "alice")
    monkeypatch.chdir(tmp_path)
    assert key_argument("alice.key", key_dir) == str(key_dir / "alice.key")
    assert keys.read_public_key(key_argument("alice.key", key_dir)) == keys.load_key_pair(key_dir / "alice.key").public_key
    (tmp_path / "alice.key").write_text("here")  # one in the working directory wins
    assert key_argument("alice.key", key_dir) == "alice.key"
    assert key_argument("sub/bob.key", key_dir) == "sub/bob.key"  # a path is taken as given
    assert key_argument("carol.key", key_dir) == "carol.key"  # nowhere: the error names what was given


@pytest.mark.parametrize(("argv", "line"), [
    (["topic", "list", "--frob"], "fabric topic list: error: unrecognized arguments: --frob"),
    (["topic", "--frob", "list"], "fabric topic: error: unrecognized arguments: --frob"),
    (["queue", "send", "q", "-m", "x", "--frob", "1"], "fabric queue send: error: unrecognized arguments: --frob 1"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to", "earliest", "--frob"],
     "fabric group reset-offsets: error: unrecognized arguments: --frob"),
    (["--frob", "topic", "list"], "fabric: error: unrecognized arguments: --frob"),
    (["queue", "peek"], "fabric queue: error: argument COMMAND: invalid choice: 'peek'"),  # not "queue_command"
])
def test_an_unknown_flag_is_refused_by_the_command_it_was_given_to(
        argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`fabric topic list --frob` said `fabric: error:`, naming no command (the top parser
    collected what the sub-parsers did not know)."""
    if argv[0] == "--frob":  # the top parser's own: _main reports it
        from fabric.cli import main

        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == EXIT_USAGE and capsys.readouterr().err.startswith(line)
        return
    assert refused(argv, capsys).startswith(line)


def test_pass_through_commands_still_receive_their_flags() -> None:
    for command in ("node", "sequencer", "bench"):
        args, rest = build_parser().parse_known_args([command, "--frob", "1"])
        assert rest == ["--frob", "1"] and args.run_argv is not None


@pytest.mark.parametrize(("argv", "prefix"), [
    (["queue", "send", "q"], "fabric queue send"),
    (["group", "reset-offsets", "g", "--topic", "t", "--to", "offset"], "fabric group reset-offsets"),
    (["topic", "reassign"], "fabric topic reassign"),
    (["status"], "fabric status"),
    (["up"], "fabric up"),
])
def test_a_usage_error_from_a_handler_names_the_command_as_typed(argv: list[str], prefix: str) -> None:
    """A handler's usage error (CliError, exit 2) was prefixed `fabric queue:` or `fabric
    group:`, the top command only; a bad --config file `fabric: error: [CONFIG_ERROR]`."""
    from fabric.errors import ConfigError

    args, _ = build_parser().parse_known_args(argv)
    assert describe_error(CliError("--dedup-id names one message", EXIT_USAGE), args)[0] == prefix
    assert describe_error(ConfigError("cannot read config file x"), args) == \
        (prefix, "cannot read config file x", EXIT_USAGE)
    assert describe_error(CliError("cannot reach ZooKeeper"), args)[0] == "fabric"  # exit 1: as before


def test_the_node_refuses_an_unknown_flag_with_its_usage_line_and_one_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`fabric node --frob` printed argparse's usage of all its options (15 lines), the
    error, then "fabric node: error: invalid command line (see the message above)"."""
    from nodes.launch import main

    assert main(["--frob"]) == EXIT_USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["usage: fabric node [--config FILE.toml] --id ID --zk HOST:PORT --data-dir DIR [OPTION ...]",
                     "fabric node: error: unrecognized arguments: --frob"]


@pytest.mark.parametrize("sizes", ["abc", "100,,1024"])
def test_bench_refuses_bad_sizes_before_starting_a_cluster(sizes: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`fabric bench --sizes abc` ended in a ValueError traceback, under `python -m bench`'s name."""
    from fabric.cli.bench import cmd_bench

    with pytest.raises(SystemExit) as exit_info:
        cmd_bench(["--sizes", sizes])
    assert exit_info.value.code == EXIT_USAGE
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("fabric bench: error: argument --sizes:")


def test_plural() -> None:
    from fabric.wording import plural

    assert [plural(n, "message") for n in (0, 1, 2, 1_000)] == ["0 messages", "1 message", "2 messages",
                                                                "1,000 messages"]
    assert plural(1, "reply", "replies") == "1 reply" and plural(3, "reply", "replies") == "3 replies"


@pytest.mark.parametrize(("argv", "message"), [
    (["--to", "latest", "--offset", "5"], "--offset goes with --to offset, not --to latest"),
    (["--to", "earliest", "--datetime", "2026-01-01"], "--datetime goes with --to datetime, not --to earliest"),
])
def test_reset_offsets_refuses_a_flag_its_target_ignores(argv: list[str], message: str) -> None:
    from fabric.cli.group import cmd_reset

    args, _ = build_parser().parse_known_args(["group", "reset-offsets", "g", "--topic", "t", *argv])
    with pytest.raises(CliError) as error:
        cmd_reset(args)  # refused before anything connects
    assert (error.value.exit_code, error.value.message) == (EXIT_USAGE, message)


def test_reset_offsets_says_when_it_clamped() -> None:
    from fabric.cli.group import clamp_warning

    assert clamp_warning("t/0", 99, 5) == ("fabric group reset-offsets: warning: t/0: offset 99 is past the "
                                           "partition's end offset 5 (the offset its next record gets); set to 5")
    assert clamp_warning("t/1", 3, 10) == ("fabric group reset-offsets: warning: t/1: offset 3 is before the "
                                           "partition's log start offset 10 (older records are gone); set to 10")


def test_make_directory_says_why_it_cannot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fabric up --data-dir FILE` said only "File exists", a file among the parents "Not a
    directory"."""
    from fabric.cli._common import make_directory

    afile = tmp_path / "afile"
    afile.write_text("x")
    for path, message in [
        (afile, f"--data-dir {afile} is a file, not a directory"),
        (afile / "sub" / "deeper", f"cannot create --data-dir {afile}/sub/deeper: {afile} is a file, not a directory"),
    ]:
        with pytest.raises(CliError) as error:
            make_directory(str(path), "--data-dir")
        assert (error.value.exit_code, error.value.message) == (EXIT_USAGE, message)
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(CliError) as error:
        make_directory(str(dangling), "--data-dir")
    assert error.value.message == (f"cannot create --data-dir {dangling}: it is a symbolic link to "
                                   f"{tmp_path / 'nowhere'}, which does not exist")
    assert make_directory(str(tmp_path / "new" / "dir"), "--data-dir").is_dir()

    def refused_mkdir(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refused_mkdir)  # root passes any permission check: simulated
    with pytest.raises(CliError) as error:
        make_directory(str(tmp_path / "locked" / "x"), "--data-dir")
    assert error.value.message == f"cannot create --data-dir {tmp_path}/locked/x: no permission to create it in {tmp_path}"


def test_security_commands_check_their_bootstrap_and_credentials_before_connecting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node address printed the bare text and exited 1 (SystemExit); an unreadable digest
    file read "cannot reach ZooKeeper: ..."."""
    from fabric.cli import security

    monkeypatch.delenv("FABRIC_ZK_DIGEST_FILE", raising=False)
    args, _ = build_parser().parse_known_args(["principal", "list", "-b", "tcp://127.0.0.1:1"])
    with pytest.raises(CliError) as error:
        security._zk_hosts(args)
    assert error.value.exit_code == EXIT_USAGE and "live in ZooKeeper" in error.value.message
    args, _ = build_parser().parse_known_args(["principal", "list", "-b", "zk://nohost"])
    with pytest.raises(CliError, match="is not HOST:PORT"):
        security._zk_hosts(args)
    args, _ = build_parser().parse_known_args(["principal", "list", "--zk-digest-file", str(tmp_path)])
    with pytest.raises(CliError) as error:
        security._digest(args)
    assert error.value.exit_code == EXIT_USAGE
    assert error.value.message == f"argument --zk-digest-file: cannot read ZooKeeper credentials {tmp_path}: Is a directory"


@pytest.mark.parametrize(("argv", "expected"), [
    (["--bootstrap", "zk://h:1", "topic", "list"], ["topic", "list", "--bootstrap", "zk://h:1"]),
    (["-b", "zk://h:1", "topic", "elect-leaders", "a", "b"], ["topic", "elect-leaders", "a", "b", "-b", "zk://h:1"]),
    (["--bootstrap=zk://h:1", "status"], ["status", "--bootstrap=zk://h:1"]),
    (["-bzk://h:1", "request", "svc", "--", "-x"], ["request", "svc", "-bzk://h:1", "--", "-x"]),
    (["topic", "list", "-b", "zk://h:1"], ["topic", "list", "-b", "zk://h:1"]),  # already after: unchanged
    (["--bootstrap", "zk://h:1"], []),  # no command: argparse asks for one
])
def test_a_bootstrap_before_the_command_goes_to_the_command(argv: list[str], expected: list[str]) -> None:
    """``fabric -b zk://... topic list`` (NATS's ``nats -s URL sub x``) used to be refused with
    "invalid choice: 'zk://...'" for the command's name."""
    from fabric.cli import bootstrap_after_the_command

    assert bootstrap_after_the_command(argv) == expected
    if expected:
        args, _rest = build_parser().parse_known_args(expected)
        assert args.bootstrap == "zk://h:1"

"""``fabric keys|principal|acl|quota``: what --help and ``acl list -p`` show, and the
refused-write message. No ZooKeeper: argparse and the pure pieces (the same commands on a
real ZooKeeper: tests/integration/test_security_cli_messages.py)."""

from __future__ import annotations

import pytest

from fabric.auth.acl import AclEntry
from fabric.cli import build_parser
from fabric.cli.security import acl_lines, refused_write_message

SUBCOMMANDS = {
    "keys": ["generate"],
    "principal": ["add", "remove", "list"],
    "acl": ["add", "remove", "list"],
    "quota": ["set", "remove", "list"],
}


@pytest.mark.parametrize("group", sorted(SUBCOMMANDS))
def test_each_security_group_lists_its_commands_with_a_summary(group: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`fabric quota --help` and `fabric principal --help` showed a bare COMMAND."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_known_args([group, "--help"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    for command in SUBCOMMANDS[group]:
        line = next((text for text in lines if text.split()[:1] == [command]), None)
        assert line is not None, f"fabric {group} --help does not list {command}"
        assert len(line.split()) > 1, f"fabric {group} --help lists {command} without a summary"


def test_the_cluster_resource_help_does_not_promise_the_topic_listing(capsys: pytest.CaptureFixture[str]) -> None:
    """It said "list all topics": METADATA lists topics per describe right, not by --cluster."""
    with pytest.raises(SystemExit):
        build_parser().parse_known_args(["acl", "add", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "list all topics" not in text
    for operation in ("describe:", "alter:", "admin:"):
        assert operation in text


def test_acl_list_for_a_principal_includes_the_entries_for_every_principal() -> None:
    """`fabric acl list -p alice` left out the '*' entries, which apply to alice too."""
    entries = [
        AclEntry.build("alice", "produce", "topic", "events"),
        AclEntry.build("*", "describe", "topic", "public.", "prefix"),
        AclEntry.build("bob", "consume", "topic", "events"),
    ]
    assert acl_lines(entries, "alice") == [
        "alice may produce on topic 'events'",
        "* may describe on topic prefix 'public.'   (from '*': applies to every principal)",
    ]
    assert acl_lines(entries, "*") == ["* may describe on topic prefix 'public.'"]
    assert acl_lines(entries, None) == [str(entry) for entry in entries]
    assert acl_lines(entries, "carol") == [
        "* may describe on topic prefix 'public.'   (from '*': applies to every principal)"]


def test_a_refused_write_says_whether_a_digest_was_passed() -> None:
    """With --zk-digest-file given and the password wrong, it said to pass --zk-digest-file."""
    assert "pass --zk-digest-file" in refused_write_message(None)
    given = refused_write_message(("/etc/fabric/zk.digest", "argument --zk-digest-file", 2))
    assert "pass --zk-digest-file" not in given
    assert "/etc/fabric/zk.digest (argument --zk-digest-file)" in given and "wrong user or password" in given


@pytest.mark.parametrize("argv", [
    ["quota", "set", "a b", "--produce-bytes-per-s", "5"],
    ["quota", "remove", ".."],
])
def test_a_quota_for_a_name_no_principal_can_have_is_a_usage_error(argv: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """It connected to ZooKeeper first and failed there (exit 1)."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_known_args(argv)
    assert exit_info.value.code == 2
    assert "principal name" in capsys.readouterr().err


def test_a_quota_for_every_principal_is_accepted() -> None:
    args, _ = build_parser().parse_known_args(["quota", "set", "*", "--produce-bytes-per-s", "1"])
    assert args.principal == "*" and args.produce_bytes_per_s == 1

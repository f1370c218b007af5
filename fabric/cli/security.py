"""``fabric keys|principal|acl|quota``: CURVE keys, principals, access rules and quotas.

    fabric keys generate NAME [--dir DIR] [--force]
    fabric principal add NAME --key KEY_OR_FILE [--role user|super|node]
    fabric principal remove NAME                           (then add again: a new key, same ACLs)
    fabric principal list
    fabric acl add --principal P --operation OP (--topic T | --topic-prefix P | --group G |
                   --group-prefix P | --queue Q | --queue-prefix P | --service S |
                   --service-prefix P | --cluster)
    fabric acl remove ... (the same options)
    fabric acl list [--principal P]                        (P's entries, then the '*' ones)
    fabric quota set PRINCIPAL --produce-bytes-per-s N     (PRINCIPAL '*': everyone without one)
    fabric quota remove PRINCIPAL
    fabric quota list

Principal and ACL commands talk to ZooKeeper: ``--bootstrap zk://host:port[/chroot]``
(or ``$FABRIC_BOOTSTRAP``, or the cluster ``fabric up`` recorded). On a secure cluster
they need its ZooKeeper credentials: ``--zk-digest-file`` (or
``$FABRIC_ZK_DIGEST_FILE``, or the file ``fabric up --secure`` recorded, for that cluster only).

"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fabric import errors
from fabric.auth import keys, store
from fabric.auth.acl import ANY_PRINCIPAL, AclEntry, Operation, ResourceType, Role
from fabric.auth.quota import DEFAULT_PRINCIPAL, Quota
from fabric.cli._common import (
    EXIT_ERROR,
    EXIT_USAGE,
    STATE_FILE,
    CliError,
    make_directory,
    parse_bootstrap,
    positive_int,
    usage_error,
)

DEFAULT_KEY_DIR = Path(os.environ.get("FABRIC_HOME", Path.home() / ".fabric")) / "keys"


def _state() -> dict[str, Any]:
    try:
        data = json.loads(STATE_FILE.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _zk_hosts(args: argparse.Namespace) -> str:
    # CliError, not SystemExit: that printed the bare text (no "fabric ...: error:") and
    # exited 1 for what is a usage error.
    if getattr(args, "bootstrap", None):
        value, origin = args.bootstrap, "argument --bootstrap"
    elif os.environ.get("FABRIC_BOOTSTRAP"):
        value, origin = os.environ["FABRIC_BOOTSTRAP"], "$FABRIC_BOOTSTRAP"
    else:
        value, origin = _state().get("bootstrap"), f"the cluster recorded in {STATE_FILE}"
    if not value:
        raise CliError("no cluster given: pass --bootstrap zk://HOST:PORT, set FABRIC_BOOTSTRAP, or run `fabric up`")
    if not str(value).startswith("zk://"):
        raise usage_error(f"principals, ACLs and quotas live in ZooKeeper: pass --bootstrap zk://HOST:PORT "
                          f"(got {value})")
    parse_bootstrap(str(value), origin)  # the form (HOST:PORT), at once: kazoo waits out its timeout on a bad one
    return str(value)[len("zk://"):]


def _targets_recorded_cluster(args: argparse.Namespace, state: dict[str, Any]) -> bool:
    """Whether the command talks to the cluster ``fabric up`` recorded: no bootstrap given
    (it falls back to that cluster), or the very bootstrap recorded."""
    given = getattr(args, "bootstrap", None) or os.environ.get("FABRIC_BOOTSTRAP")
    return not given or given == state.get("bootstrap")


def _digest_source(args: argparse.Namespace) -> tuple[str, str, int] | None:
    """Where the ZooKeeper credentials come from: (path, how it was given, the exit code of
    a file that cannot be read), or None on a plaintext cluster."""
    state = _state()
    # The recorded digest is the password of the cluster `fabric up` started: ZooKeeper's
    # digest scheme sends it in the clear to whichever server the command connects to, so
    # it is offered to that cluster only, never to another --bootstrap.
    recorded = state.get("zk_digest_file") if _targets_recorded_cluster(args, state) else None
    if getattr(args, "zk_digest_file", None):
        return args.zk_digest_file, "argument --zk-digest-file", EXIT_USAGE
    if os.environ.get("FABRIC_ZK_DIGEST_FILE"):
        return os.environ["FABRIC_ZK_DIGEST_FILE"], "$FABRIC_ZK_DIGEST_FILE", EXIT_USAGE
    if recorded:
        return str(recorded), f"the digest file recorded in {STATE_FILE}", EXIT_ERROR
    return None


def _digest(args: argparse.Namespace) -> str | None:
    """The ZooKeeper credentials, or None on a plaintext cluster. A file that cannot be read
    is said to be that, naming where it was given, before anything connects (it read as
    "cannot reach ZooKeeper")."""
    source = _digest_source(args)
    if source is None:
        return None
    path, origin, code = source
    try:
        return store.read_digest(path)
    except errors.FabricError as exc:
        raise CliError(f"{origin}: {exc.message}", code) from None


def refused_write_message(source: tuple[str, str, int] | None) -> str:
    """Why ZooKeeper refused a write. ZooKeeper's digest scheme accepts any user:password at
    login and refuses only the write, so a wrong password looks like no password: the
    message says which it was (it told a user who had passed --zk-digest-file to pass it)."""
    if source is None:
        return ("ZooKeeper refused the write: this cluster is secure; pass --zk-digest-file "
                "(or set FABRIC_ZK_DIGEST_FILE)")
    path, origin, _ = source
    return (f"ZooKeeper refused the write with the digest in {path} ({origin}): its user:password is not the "
            f"one that owns this cluster's znodes (a wrong user or password, or another cluster's file; "
            f"the direct plane's zk-direct.digest may not write principals, ACLs or quotas)")


@contextmanager
def _zk(args: argparse.Namespace) -> Iterator[Any]:
    from fabric.zk import close_client

    hosts, digest = _zk_hosts(args), _digest(args)  # the user's mistakes, before "cannot reach"
    try:
        zk = store.connect(hosts, digest)
    except Exception as exc:  # kazoo raises its own timeout types
        raise errors.NoBrokersAvailableError(f"cannot reach ZooKeeper: {exc}") from None
    try:
        yield zk
    except store.NoAuthError:
        raise errors.AuthorizationFailedError(
            refused_write_message(_digest_source(args) if digest else None)) from None
    finally:
        close_client(zk)


def _with_zk(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--bootstrap", "-b", help="zk://host:port[/chroot]")
    parser.add_argument("--zk-digest-file", help="ZooKeeper credentials (user:password) of a secure cluster")
    return parser


_RESOURCE_OPTIONS = [(rtype, suffix) for rtype in ResourceType if rtype is not ResourceType.CLUSTER
                     for suffix in ("", "-prefix")]


def _acl_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--principal", "-p", required=True, help="principal name, or '*' for every principal")
    parser.add_argument("--operation", "-o", required=True,
                        choices=[o.value for o in Operation if o is not Operation.REPLICATE])
    where = parser.add_mutually_exclusive_group(required=True)
    for rtype, suffix in _RESOURCE_OPTIONS:
        kind = "names starting with" if suffix else "name"
        where.add_argument(f"--{rtype.value}{suffix}", metavar="NAME", help=f"{rtype.value} {kind} NAME")
    where.add_argument("--cluster", action="store_true", help=CLUSTER_HELP)


def _entry(args: argparse.Namespace) -> AclEntry:
    if args.cluster:
        return AclEntry.build(args.principal, args.operation, "cluster", "cluster")
    for rtype, suffix in _RESOURCE_OPTIONS:
        value = getattr(args, f"{rtype.value}{suffix}".replace("-", "_"))
        if value is not None:
            return AclEntry.build(args.principal, args.operation, rtype.value, value,
                                  "prefix" if suffix else "literal")
    raise usage_error("name a resource: --topic, --topic-prefix, ..., or --cluster")


def _name(what: str) -> Any:
    """An argparse type: a key or principal name that cannot be one is a usage error (exit
    2), not a refusal (exit 1) after the command started."""
    def check(text: str) -> str:
        try:
            return keys.validate_name(text, what)
        except errors.FabricError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
    return check


def _quota_principal(text: str) -> str:
    """An argparse type: ``*`` or a name a principal can have. A bad one was refused by
    ZooKeeper's side of the command (exit 1) after connecting."""
    return text if text == DEFAULT_PRINCIPAL else _name("principal")(text)


def _commands(parser: argparse.ArgumentParser, dest: str) -> Any:
    """The sub-commands of a command group, listed with their summaries in the group's
    --help (without a help= each, `fabric quota --help` showed a bare COMMAND)."""
    return parser.add_subparsers(dest=dest, required=True, title="commands", metavar="COMMAND")


def _command(commands: Any, name: str, summary: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=summary, description=summary)
    return parser


# What each operation on the cluster resource allows (required_access in fabric/auth/acl.py).
# Not the topic listing: METADATA of all topics needs no cluster right and shows each
# principal only the topics it may describe.
CLUSTER_HELP = ("the cluster itself. describe: list consumer groups (fabric group list), describe topics without "
                "naming them (fabric topic describe; only topics the principal may describe are shown); alter: elect "
                "leaders, reassign partitions; admin: drain nodes (fabric node drain) and any other API a node serves "
                "that the ACL table of docs/SECURITY.md does not name. Listing topics (fabric topic list) needs none of these")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k = subparsers.add_parser("keys", help="CURVE key pairs for secure clusters")
    k.set_defaults(run=cmd_keys)
    ksub = _commands(k, "keys_command")
    gen = _command(ksub, "generate", "write NAME.key (public) and NAME.key_secret (mode 0600)")
    gen.add_argument("name", type=_name("key"))
    gen.add_argument("--dir", default=str(DEFAULT_KEY_DIR), help=f"where to write (default {DEFAULT_KEY_DIR})")
    gen.add_argument("--force", action="store_true", help="overwrite existing files")

    p = subparsers.add_parser("principal", help="register, remove and list public keys")
    p.set_defaults(run=cmd_principal)
    psub = _commands(p, "principal_command")
    add = _with_zk(_command(psub, "add", "register a public key under a new principal name"))
    add.add_argument("name", type=_name("principal"))
    add.add_argument("--key", "-k", required=True,
                     help=f"Z85 public key, or a .key/.key_secret file (a bare name not found here: in {DEFAULT_KEY_DIR})")
    add.add_argument("--role", choices=[r.value for r in Role], default="user",
                     help="user: ACLs decide; super: operator, may do everything; node: a storage node")
    remove = _with_zk(_command(psub, "remove", "unregister a principal (its ACL entries and quota stay); "
                                                "remove, then add again to rotate its key"))
    remove.add_argument("name")
    _with_zk(_command(psub, "list", "every principal: name, role, public key"))

    a = subparsers.add_parser("acl", help="allow principals operations on topics, groups, queues, services")
    a.set_defaults(run=cmd_acl)
    asub = _commands(a, "acl_command")
    _acl_options(_with_zk(_command(asub, "add", "allow a principal (or '*') an operation on a resource")))
    _acl_options(_with_zk(_command(asub, "remove", "remove one entry (the same options as add)")))
    lst = _with_zk(_command(asub, "list", "every entry, or those that apply to one principal"))
    lst.add_argument("--principal", "-p",
                     help="only the entries that apply to this principal: its own and the '*' ones")

    q = subparsers.add_parser("quota", help="per-principal produce byte rates (responses are delayed, never dropped)")
    q.set_defaults(run=cmd_quota)
    qsub = _commands(q, "quota_command")
    qset = _with_zk(_command(qsub, "set", "set (or replace) a principal's produce byte rate"))
    qset.add_argument("principal", type=_quota_principal, help="principal name, or '*' for every principal without its own quota")
    qset.add_argument("--produce-bytes-per-s", type=positive_int, required=True,
                      help="bytes per second this principal may produce (at least 1; no quota at all: "
                           "fabric quota remove)")
    qremove = _with_zk(_command(qsub, "remove", "remove a principal's quota (or the '*' default)"))
    qremove.add_argument("principal", type=_quota_principal, help="principal name, or '*'")
    _with_zk(_command(qsub, "list", "every quota: principal and produce bytes per second"))


def cmd_quota(args: argparse.Namespace) -> int:
    with _zk(args) as zk:
        if args.quota_command == "set":
            store.set_quota(zk, args.principal, Quota(args.produce_bytes_per_s))
            print(f"quota for {args.principal}: produce {args.produce_bytes_per_s:,} bytes/s")
        elif args.quota_command == "remove":
            store.set_quota(zk, args.principal, None)
            print(f"removed the quota of {args.principal}")
        else:
            for principal, quota in sorted(store.list_quotas(zk).items()):
                print(f"{principal}\tproduce_bytes_per_s={quota.produce_bytes_per_s}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    make_directory(args.dir, "--dir")  # a file in the way read "File exists" otherwise
    public_path, secret_path = keys.generate_key_pair(args.dir, args.name, overwrite=args.force)
    print(f"public key  {public_path}   (register it: fabric principal add {args.name} --key {public_path})")
    print(f"secret key  {secret_path}   (mode 0600; give it only to {args.name})")
    print(keys.load_key_pair(public_path).public_key.decode())
    return 0


def key_argument(value: str, key_dir: Path = DEFAULT_KEY_DIR) -> str:
    """``--key alice.key`` right after ``fabric keys generate alice`` (docs/SECURITY.md): a
    bare file name that is not in the working directory is looked up where ``keys
    generate`` writes, so the documented pair of commands works from any directory."""
    if not Path(value).exists() and Path(value).name == value and (key_dir / value).is_file():
        return str(key_dir / value)
    return value


def cmd_principal(args: argparse.Namespace) -> int:
    with _zk(args) as zk:
        if args.principal_command == "add":
            principal = store.add_principal(zk, args.name, keys.read_public_key(key_argument(args.key)), Role(args.role))
            print(f"added principal {principal.name} ({principal.role.value}) {principal.public_key}")
        elif args.principal_command == "remove":
            store.remove_principal(zk, args.name)
            print(f"removed principal {args.name} (its ACL entries and quota stay until removed)")
        else:
            for principal in store.list_principals(zk):
                print(f"{principal.name}\t{principal.role.value}\t{principal.public_key}")
    return 0


def cmd_acl(args: argparse.Namespace) -> int:
    with _zk(args) as zk:
        if args.acl_command == "add":
            entry = _entry(args)
            changed = store.add_acl(zk, entry)
            print(f"{'added' if changed else 'already there'}: {entry}")
            if entry.principal != ANY_PRINCIPAL and zk.exists(store.principal_path(entry.principal)) is None:
                # Allowed, as Kafka allows it (grant before the key is made), but a typo in
                # the name would otherwise pass unseen.
                print(f"note: no principal {entry.principal!r} is registered yet; the entry applies once one is "
                      f"(fabric principal add {entry.principal} ...)", file=sys.stderr)
        elif args.acl_command == "remove":
            entry = _entry(args)
            if not store.remove_acl(zk, entry):
                raise errors.InvalidRequestError(f"no such ACL entry: {entry}")
            print(f"removed: {entry}")
        else:
            if args.principal is not None and args.principal != ANY_PRINCIPAL:
                _note_role(zk, args.principal)
            for line in acl_lines(store.list_acls(zk), args.principal):
                print(line)
    return 0


def acl_lines(entries: list[AclEntry], principal: str | None) -> list[str]:
    """What ``fabric acl list [-p P]`` prints: every entry, or the entries that apply to P,
    its own first, then those for ``*`` (every principal), marked as such: an operator who
    asks what alice may do needs both, and the ``*`` ones were left out."""
    if principal is None:
        return [str(entry) for entry in entries]
    own = [str(entry) for entry in entries if entry.principal == principal]
    if principal == ANY_PRINCIPAL:
        return own
    return own + [f"{entry}   (from '*': applies to every principal)"
                  for entry in entries if entry.principal == ANY_PRINCIPAL]


def _note_role(zk: Any, name: str) -> None:
    """On stderr, when the entries do not tell what ``name`` may do: a super or node key
    may do everything whatever the ACLs say, and entries for an unregistered name apply to
    nobody yet."""
    principal = store.find_principal(zk, name)
    if principal is None:
        print(f"note: no principal {name!r} is registered; these entries apply once one is", file=sys.stderr)
    elif principal.role is not Role.USER:
        print(f"note: {name} has role {principal.role.value}: every operation on every resource is allowed, "
              f"whatever the entries say", file=sys.stderr)


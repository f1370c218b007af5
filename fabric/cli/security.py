"""``fabric keys|principal|acl``: CURVE keys, principals and access rules.

    fabric keys generate NAME [--dir DIR] [--force]
    fabric principal add NAME --key KEY_OR_FILE [--role user|super|node]
    fabric principal remove NAME
    fabric principal list
    fabric acl add --principal P --operation OP (--topic T | --topic-prefix P | --group G |
                   --group-prefix P | --queue Q | --queue-prefix P | --service S |
                   --service-prefix P | --cluster)
    fabric acl remove ... (the same options)
    fabric acl list [--principal P]
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
from fabric.auth.quota import Quota
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


def _digest(args: argparse.Namespace) -> str | None:
    """The ZooKeeper credentials, or None on a plaintext cluster. A file that cannot be read
    is said to be that, naming where it was given, before anything connects (it read as
    "cannot reach ZooKeeper")."""
    state = _state()
    # The recorded digest is the password of the cluster `fabric up` started: ZooKeeper's
    # digest scheme sends it in the clear to whichever server the command connects to, so
    # it is offered to that cluster only, never to another --bootstrap.
    recorded = state.get("zk_digest_file") if _targets_recorded_cluster(args, state) else None
    if getattr(args, "zk_digest_file", None):
        path, origin, code = args.zk_digest_file, "argument --zk-digest-file", EXIT_USAGE
    elif os.environ.get("FABRIC_ZK_DIGEST_FILE"):
        path, origin, code = os.environ["FABRIC_ZK_DIGEST_FILE"], "$FABRIC_ZK_DIGEST_FILE", EXIT_USAGE
    elif recorded:
        path, origin, code = recorded, f"the digest file recorded in {STATE_FILE}", EXIT_ERROR
    else:
        return None
    try:
        return store.read_digest(path)
    except errors.FabricError as exc:
        raise CliError(f"{origin}: {exc.message}", code) from None


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
            "ZooKeeper refused the write: this cluster is secure; pass --zk-digest-file "
            "(or set FABRIC_ZK_DIGEST_FILE)") from None
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
    where.add_argument("--cluster", action="store_true", help="the cluster itself (elect leaders, list all topics)")


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


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k = subparsers.add_parser("keys", help="CURVE key pairs for secure clusters")
    k.set_defaults(run=cmd_keys)
    ksub = k.add_subparsers(dest="keys_command", required=True)
    gen = ksub.add_parser("generate", help="write NAME.key (public) and NAME.key_secret (mode 0600)")
    gen.add_argument("name", type=_name("key"))
    gen.add_argument("--dir", default=str(DEFAULT_KEY_DIR), help=f"where to write (default {DEFAULT_KEY_DIR})")
    gen.add_argument("--force", action="store_true", help="overwrite existing files")

    p = subparsers.add_parser("principal", help="register, remove and list public keys")
    p.set_defaults(run=cmd_principal)
    psub = p.add_subparsers(dest="principal_command", required=True)
    add = _with_zk(psub.add_parser("add"))
    add.add_argument("name", type=_name("principal"))
    add.add_argument("--key", "-k", required=True,
                     help=f"Z85 public key, or a .key/.key_secret file (a bare name not found here: in {DEFAULT_KEY_DIR})")
    add.add_argument("--role", choices=[r.value for r in Role], default="user",
                     help="user: ACLs decide; super: operator, may do everything; node: a storage node")
    remove = _with_zk(psub.add_parser("remove"))
    remove.add_argument("name")
    _with_zk(psub.add_parser("list"))

    a = subparsers.add_parser("acl", help="allow principals operations on topics, groups, queues, services")
    a.set_defaults(run=cmd_acl)
    asub = a.add_subparsers(dest="acl_command", required=True)
    _acl_options(_with_zk(asub.add_parser("add")))
    _acl_options(_with_zk(asub.add_parser("remove")))
    lst = _with_zk(asub.add_parser("list"))
    lst.add_argument("--principal", "-p")

    q = subparsers.add_parser("quota", help="per-principal produce byte rates (responses are delayed, never dropped)")
    q.set_defaults(run=cmd_quota)
    qsub = q.add_subparsers(dest="quota_command", required=True)
    qset = _with_zk(qsub.add_parser("set"))
    qset.add_argument("principal", help="principal name, or '*' for every principal without its own quota")
    qset.add_argument("--produce-bytes-per-s", type=positive_int, required=True,
                      help="bytes per second this principal may produce (at least 1)")
    qremove = _with_zk(qsub.add_parser("remove"))
    qremove.add_argument("principal")
    _with_zk(qsub.add_parser("list"))


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
            print(f"removed principal {args.name} (its ACL entries stay until removed)")
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
            for entry in store.list_acls(zk):
                if args.principal in (None, entry.principal):
                    print(entry)
    return 0


"""``fabric topic reassign`` and the per-partition log lines of ``fabric topic describe``.

A plan file moves many partitions at once (the shape of Kafka's reassignment JSON)::

    {"partitions": [{"topic": "orders", "partition": 0, "replicas": [1, 2, 4]},
                    {"topic": "orders", "partition": 1, "replicas": [2, 4, 3]}]}
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fabric.cli._common import (
    NODE_ID_MAX,
    CliError,
    non_negative_int,
    partition_index,
    timeout_seconds,
    usage_error,
)
from fabric.limits import PARTITIONS_MAX, REASSIGN_THROTTLE_BYTES_PER_S_MIN
from fabric.wording import plural

REASSIGN_WAIT_S_DEFAULT = 600.0
PLAN_PARTITIONS_MAX = 10_000


def add_parser(tsub: argparse._SubParsersAction[argparse.ArgumentParser], with_bootstrap: Any) -> None:
    move = with_bootstrap(tsub.add_parser(
        "reassign", help="move partitions to other nodes (new replicas catch up, then the old ones go)"))
    move.add_argument("name", nargs="?", help="topic (or give --plan)")
    move.add_argument("--partition", type=partition_index, help="the partition to move")
    move.add_argument("--replicas", type=_node_list, help="the new replica node ids, e.g. 1,2,4 (first = preferred leader)")
    move.add_argument("--plan", metavar="FILE", help='JSON: {"partitions": [{"topic", "partition", "replicas"}, ...]}')
    move.add_argument("--throttle-bytes-per-s", type=_throttle, default=0, metavar="BYTES",
                      help="cap on the new replicas' catch-up fetches, bytes per second, at least "
                           f"{REASSIGN_THROTTLE_BYTES_PER_S_MIN} (default 0: no cap)")
    move.add_argument("--generate", metavar="NODES", type=_node_list,
                      help="print a plan spreading TOPIC (default: every topic) over these node ids, e.g. 1,2,4; "
                           "nothing moves until you run it with --plan")
    move.add_argument("--cancel", action="store_true",
                      help="stop the running move of TOPIC --partition P (or of each plan entry): new replicas go")
    move.add_argument("--wait", action="store_true", help="return only once every move has finished")
    move.add_argument("--timeout", type=timeout_seconds, default=REASSIGN_WAIT_S_DEFAULT, metavar="SECONDS",
                      help=f"with --wait: give up after this long (default {REASSIGN_WAIT_S_DEFAULT:g})")


def _throttle(text: str) -> int:
    """0 (no cap) or at least REASSIGN_THROTTLE_BYTES_PER_S_MIN: a smaller cap is a usage
    error here (exit 2), not a refusal from the controller after connecting."""
    value = non_negative_int(text)
    if 0 < value < REASSIGN_THROTTLE_BYTES_PER_S_MIN:
        raise argparse.ArgumentTypeError(
            f"{value} is below {REASSIGN_THROTTLE_BYTES_PER_S_MIN} bytes/s (a copy that slow would never finish); "
            "give 0 for no cap")
    return value


def _node_list(text: str) -> list[int]:
    try:
        nodes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected node ids like 1,2,4, got {text!r}") from None
    if not nodes or any(n < 0 for n in nodes):
        raise argparse.ArgumentTypeError(f"expected node ids like 1,2,4, got {text!r}")
    too_large = [n for n in nodes if n > NODE_ID_MAX]
    if too_large:  # node ids are i32 on the wire
        raise argparse.ArgumentTypeError(f"node id {too_large[0]} is more than {NODE_ID_MAX:,} (node ids are i32)")
    twice = next((n for i, n in enumerate(nodes) if n in nodes[:i]), None)
    if twice is not None:  # a node holds one copy of a partition: --generate 1,1,1 planned [1, 1, 1]
        raise argparse.ArgumentTypeError(f"node {twice} appears twice in {text!r}")
    return nodes


def read_plan(path: str) -> list[tuple[str, int, list[int]]]:
    """The moves in a plan file; a clear error (and nothing moved) if it is malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise CliError(f"cannot read plan {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"plan {path} is not JSON (UTF-8): {exc}") from None
    rows = data.get("partitions") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows or len(rows) > PLAN_PARTITIONS_MAX:
        raise CliError(f'plan {path}: expected {{"partitions": [...]}} with 1 to {PLAN_PARTITIONS_MAX} entries')
    moves = []
    for i, row in enumerate(rows):
        ok = (isinstance(row, dict) and isinstance(row.get("topic"), str)
              and isinstance(row.get("partition"), int) and 0 <= row["partition"] < PARTITIONS_MAX
              and isinstance(row.get("replicas"), list) and row["replicas"]
              and all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= NODE_ID_MAX
                      for r in row["replicas"]))
        if not ok:
            raise CliError(f"plan {path}: entry {i} needs topic (string), partition (0 to {PARTITIONS_MAX - 1}) "
                           f"and replicas (a list of node ids, 0 to {NODE_ID_MAX})")
        moves.append((row["topic"], row["partition"], list(row["replicas"])))
    return moves


def target_replicas(replicas: list[int] | tuple[int, ...], rows: list[dict[str, Any]]) -> list[int]:
    """A partition's replicas once its running move is done: while one runs, the replicas
    are the old and the new ones together (the leader's DESCRIBE_REPLICAS row says which
    leave), and counting them all would plan a replica too many."""
    leader = next((r for r in rows if r["role"] == "leader"), None)
    leaving = set(leader["removing"]) if leader is not None else set()
    return [r for r in replicas if r not in leaving]


def generate_plan(descriptions: list[Any], nodes: list[int],
                  copies: dict[tuple[str, int], list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Each topic's partitions spread round robin over ``nodes`` (as topic creation does),
    keeping each partition's replica count; partitions already placed so are left out.
    ``copies``: DESCRIBE_REPLICAS rows, so a partition that is moving counts as its target.
    Every partition must have at most ``len(nodes)`` replicas (``too_few_nodes``)."""
    from fabric import zk as zkl

    moves = []
    for desc in descriptions:
        for p in desc.partitions:
            target = target_replicas(p.replicas, (copies or {}).get((desc.name, p.partition), []))
            wanted = zkl.assign_replicas(desc.name, len(desc.partitions), len(target), nodes)[p.partition]
            if target != wanted:
                moves.append({"topic": desc.name, "partition": p.partition, "replicas": wanted})
    return {"partitions": moves}


def too_few_nodes(descriptions: list[Any], nodes: list[int],
                  copies: dict[tuple[str, int], list[dict[str, Any]]]) -> str | None:
    """Why ``nodes`` cannot hold the topics' replicas, or None: a partition keeps its replica
    count, one copy per node, so a plan needs at least that many nodes. (It was reported
    as "replication_factor=3 but only 1 live nodes", blaming the cluster for the list.)"""
    most = max(((len(target_replicas(p.replicas, copies.get((d.name, p.partition), []))), d.name)
                for d in descriptions for p in d.partitions), default=(0, ""))
    count, topic = most
    if count <= len(nodes):
        return None
    return (f"topic {topic} keeps {plural(count, 'replica')} of each partition, one per node, so a plan for it "
            f"needs at least {plural(count, 'node')}; {len(nodes)} given")


def _generate(admin: Any, args: argparse.Namespace) -> int:
    """``--generate NODES``: print a plan, move nothing."""
    given = ",".join(map(str, args.generate))
    ignored = [flag for flag, value in (("--plan", args.plan), ("--partition", args.partition is not None),
                                        ("--replicas", args.replicas), ("--cancel", args.cancel), ("--wait", args.wait),
                                        ("--throttle-bytes-per-s", args.throttle_bytes_per_s)) if value]
    if ignored:  # it only prints a plan: these would be silently dropped
        raise usage_error(f"--generate only prints a plan for TOPIC (or every topic): drop {', '.join(ignored)}, "
                          "or run the plan with --plan")
    live = admin.nodes()
    registered = ", ".join(map(str, sorted(live))) or "none"
    unknown = sorted(set(args.generate) - set(live))
    if unknown:  # the plan would be refused when run; say so now
        which = f"node {unknown[0]} is" if len(unknown) == 1 else f"nodes {unknown} are"
        raise CliError(f"--generate {given}: {which} not registered (registered nodes: {registered})")
    topics = [args.name] if args.name else None
    descriptions = admin.describe_topics(topics)
    copies = admin.describe_replicas(topics)
    short = too_few_nodes(descriptions, args.generate, copies)
    if short is not None:
        raise CliError(f"--generate {given}: {short} (registered nodes: {registered})")
    print(json.dumps(generate_plan(descriptions, args.generate, copies), indent=1))
    return 0


def cmd_reassign(admin: Any, args: argparse.Namespace) -> int:
    if args.generate:
        return _generate(admin, args)
    if args.plan:
        if args.name or args.partition is not None or args.replicas:
            raise usage_error("give either --plan or TOPIC --partition --replicas, not both")
        moves = read_plan(args.plan)
    elif args.cancel:
        if not args.name or args.partition is None or args.replicas:
            raise usage_error("--cancel takes TOPIC --partition P (or --plan FILE), and no --replicas")
        moves = [(args.name, args.partition, [])]
    else:
        if not args.name or args.partition is None or not args.replicas:
            raise usage_error("give TOPIC --partition P --replicas 1,2,4, or --plan FILE, or --generate NODES")
        moves = [(args.name, args.partition, args.replicas)]
    if args.cancel:
        for topic, partition, _replicas in moves:
            admin.cancel_reassignment(topic, partition)
            print(f"cancelled the move of {topic}/{partition}")
        return 0
    for topic, partition, replicas in moves:
        admin.reassign_partition(topic, partition, replicas, throttle_bytes_per_s=args.throttle_bytes_per_s)
        print(f"moving {topic}/{partition} to replicas {replicas}")
    if args.wait:
        for topic, partition, replicas in moves:
            try:
                admin.wait_reassigned(topic, partition, replicas, timeout_s=args.timeout)
            except TimeoutError as exc:
                raise CliError(f"{exc}; it keeps moving: fabric topic describe {topic}") from None
        print(f"done: {plural(len(moves), 'partition')} moved")
    else:
        print("follow the progress with: fabric topic describe" + (f" {moves[0][0]}" if len(moves) == 1 else ""))
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def log_line(rows: list[dict[str, Any]]) -> str:
    """The log part of a partition's describe line, from the nodes' DESCRIBE_REPLICAS rows:
    the leader's log start, end (high watermark) and size, and a move's progress."""
    leader = next((r for r in rows if r["role"] == "leader"), None)
    if leader is None:
        return "log ? (no leader answered)"
    start, end = leader["log_start_offset"], leader["high_watermark"]
    text = f"log {start}..{end} ({plural(end - start, 'record')}, {_size(leader['size_bytes'])})"
    if leader["adding"] or leader["removing"]:
        leader_end = leader["log_end_offset"]
        progress = []
        for node_id in leader["adding"]:
            row = next((r for r in rows if r["node_id"] == node_id), None)
            copied = row["log_end_offset"] - start if row is not None else 0
            share = 100.0 * max(0, copied) / max(1, leader_end - start)
            progress.append(f"node {node_id} at {row['log_end_offset'] if row else '?'}/{leader_end} ({share:.0f}%)")
        throttle = leader["throttle_bytes_per_s"]
        text += (f"\n      reassigning: adding {leader['adding']} removing {leader['removing']}"
                 f"{', throttle ' + _size(throttle) + '/s' if throttle else ''}: {', '.join(progress) or 'removing'}")
    return text

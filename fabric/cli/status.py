"""``fabric status``: the cluster on one screen, and an exit code for scripts.

It reads ZooKeeper, the source of truth for membership and partition state, so it works
while nodes are down (which is when it is needed). Every ZooKeeper call has a timeout.

Exit codes (``fabric status && deploy-next``; a Kubernetes or Nomad health check):

    0  healthy: a controller, every node that holds replicas is up, every partition has a
       live leader and a full in-sync replica set
    1  unhealthy: the problems are listed (a node down, partitions offline,
       under-replicated or below min_insync, no controller)
    3  the cluster cannot be asked: ZooKeeper did not answer
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from fabric.cli._common import bootstrap, timeout_seconds, usage_error, with_bootstrap
from fabric.cli._queue_status import add_queues, queue_lines
from fabric.wording import plural

ZK_CONNECT_TIMEOUT_S = 5.0
ZK_CALL_TIMEOUT_S = 5.0
EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNREACHABLE = 3
LIST_OFFSETS_TIMEOUT_MS = 3_000
LISTED_PARTITIONS_MAX = 20  # the text screen lists this many problem partitions, then counts the rest
GROUPS_DESCRIBED_MAX = 50  # beyond this, `fabric group list` is the tool


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = with_bootstrap(subparsers.add_parser(
        "status", help="nodes, controller and partition health on one screen; exit 1 when unhealthy"),
        zookeeper_only=True)
    status.add_argument("--json", action="store_true", help="print one JSON object instead of the screen")
    status.add_argument("--timeout", type=timeout_seconds, default=ZK_CONNECT_TIMEOUT_S, metavar="SECONDS",
                        help=f"how long to wait for ZooKeeper (default {ZK_CONNECT_TIMEOUT_S:g})")
    status.add_argument("--no-groups", action="store_true",
                        help="skip consumer groups and queues (asked from the nodes)")
    status.set_defaults(run=cmd_status)


@dataclass
class Status:
    """What ``collect`` found; ``problems`` empty means healthy."""

    zookeeper: str
    controller: int | None = None
    sequencer: dict[str, Any] | None = None  # the active instance, from ZooKeeper
    sequencer_epoch: int | None = None
    strict_order_topics: int = 0
    nodes: list[dict[str, Any]] = field(default_factory=list)
    topics: int = 0
    partitions: int = 0
    offline: list[dict[str, Any]] = field(default_factory=list)
    under_replicated: list[dict[str, Any]] = field(default_factory=list)
    reassigning: list[dict[str, Any]] = field(default_factory=list)  # shown, not judged: an operator's move
    below_min_insync: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    groups: list[dict[str, Any]] | None = None  # None: not asked (no live node)
    groups_error: str = ""
    queues: list[dict[str, Any]] | None = None  # None: not asked (fabric/cli/_queue_status.py)
    queues_error: str = ""

    @property
    def healthy(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "zookeeper": self.zookeeper, "controller": self.controller,
                "sequencer": self.sequencer, "sequencer_epoch": self.sequencer_epoch,
                "nodes": self.nodes, "topics": self.topics, "partitions": self.partitions,
                "offline_partitions": self.offline, "under_replicated_partitions": self.under_replicated,
                "reassigning_partitions": self.reassigning,
                "below_min_insync_partitions": self.below_min_insync, "groups": self.groups,
                "groups_error": self.groups_error, "queues": self.queues, "queues_error": self.queues_error,
                "problems": self.problems}


def _zk_hosts(bootstrap_value: str) -> str:
    parts = [p.strip() for p in bootstrap_value.split(",") if p.strip()]
    if not parts or not parts[0].startswith("zk://"):
        raise usage_error("fabric status reads ZooKeeper: pass --bootstrap zk://HOST:PORT[/chroot] "
                          f"(got {bootstrap_value!r})")
    return ",".join(p.removeprefix("zk://") for p in parts)


def collect(zk: Any, zookeeper: str, timeout_s: float = ZK_CALL_TIMEOUT_S) -> Status:
    """Read membership, the controller and every partition state; decide what is wrong."""
    from kazoo.exceptions import NoNodeError

    from fabric import errors
    from fabric import zk as zkl
    from fabric.sequencer_client import SEQUENCER_ACTIVE, SEQUENCER_STATE

    def get(path: str) -> bytes | None:
        try:
            raw, _stat = zk.get_async(path).get(timeout=timeout_s)
            return bytes(raw)
        except NoNodeError:
            return None

    def children(path: str) -> list[str]:
        try:
            return sorted(zk.get_children_async(path).get(timeout=timeout_s))
        except NoNodeError:
            return []

    status = Status(zookeeper)
    live: dict[int, zkl.NodeInfo] = {}
    for child in children(zkl.NODES):
        raw = get(zkl.node_path(int(child)))
        if raw is not None:
            live[int(child)] = zkl.NodeInfo.decode(raw)
    raw_controller = get(zkl.CONTROLLER)
    status.controller = int(raw_controller) if raw_controller else None
    raw_sequencer = get(SEQUENCER_ACTIVE)
    status.sequencer = json.loads(raw_sequencer) if raw_sequencer else None
    raw_sequencer_state = get(SEQUENCER_STATE)
    status.sequencer_epoch = json.loads(raw_sequencer_state).get("epoch") if raw_sequencer_state else None

    def value(read: Any) -> bytes | None:
        """A ``get_many`` result: the data, None for a znode deleted while we looked."""
        if isinstance(read, NoNodeError):
            return None
        if isinstance(read, errors.RequestTimedOutError):
            raise TimeoutError(str(read))  # reported as ZooKeeper not answering, as a single get's
        if isinstance(read, Exception):
            raise read
        return bytes(read[0])

    # Pipelined reads (zkl.get_many): one get per znode in turn was 2,400 round trips at
    # 2,000 partitions (docs/BENCHMARKS.md, "Many partitions").
    topics = children(zkl.TOPICS)
    configs: dict[str, zkl.TopicConfig] = {}
    for topic, read in zip(topics, zkl.get_many(zk, [zkl.topic_path(t) for t in topics], timeout_s), strict=True):
        raw_config = value(read)
        if raw_config is not None:  # (None: deleted while we looked)
            configs[topic] = zkl.TopicConfig.decode(raw_config)
    wanted = [(topic, p) for topic, config in configs.items() for p in range(config.partitions)]
    states = zip(wanted, zkl.get_many(zk, [zkl.partition_path(t, p) for t, p in wanted], timeout_s), strict=True)
    status.topics = len(configs)
    status.strict_order_topics = sum(config.strict_order for config in configs.values())
    leaders: dict[int, int] = {}
    replicas: dict[int, int] = {}
    for (topic, partition), read in states:
        config = configs[topic]
        raw_state = value(read)
        if raw_state is None:
            continue
        state = zkl.PartitionState.decode(partition, raw_state)
        status.partitions += 1
        for replica in state.replicas:
            replicas[replica] = replicas.get(replica, 0) + 1
        row = {"topic": topic, "partition": state.partition, "leader": state.leader,
               "leader_epoch": state.leader_epoch, "replicas": list(state.replicas), "isr": list(state.isr),
               "min_insync": config.min_insync}
        if state.leader < 0 or state.leader not in live:
            # A live in-sync replica means the controller can elect it (an election in
            # progress, or no controller); none means waiting for a replica to return.
            status.offline.append({**row, "live_isr": [r for r in state.isr if r in live]})
        else:
            leaders[state.leader] = leaders.get(state.leader, 0) + 1
        # A move's new replicas are still copying (docs/OPERATIONS.md, "Moving partitions"):
        # not in the ISR yet is expected of them, as Kafka counts it.
        settled = [r for r in state.replicas if r not in state.adding]
        if len(set(state.isr) & set(settled)) < len(settled):
            status.under_replicated.append({**row, "missing": sorted(set(settled) - set(state.isr))})
        if state.reassigning:
            status.reassigning.append({**row, "adding": list(state.adding), "removing": list(state.removing)})
        if len(state.isr) < config.min_insync:
            status.below_min_insync.append(row)

    now_ms = int(time.time() * 1000)
    for node_id in sorted(set(live) | set(replicas)):
        info = live.get(node_id)
        status.nodes.append({
            "id": node_id, "up": info is not None, "address": info.address if info else None,
            "metrics": (info.metrics_address or None) if info else None,
            "version": (info.version or None) if info else None,
            "pid": info.pid if info else None, "leaders": leaders.get(node_id, 0),
            "replicas": replicas.get(node_id, 0),
            "uptime_s": round((now_ms - info.started_ms) / 1000) if info and info.started_ms else None,
            "controller": node_id == status.controller,
        })

    if status.controller is None:
        status.problems.append("no controller elected (no node can fail partitions over)")
    elif status.controller not in live:
        status.problems.append(f"controller {status.controller} is not a live node")
    for node in status.nodes:
        if not node["up"]:
            status.problems.append(f"node {node['id']} is down (it holds replicas of "
                                   f"{plural(node['replicas'], 'partition')})")
    if status.offline:
        electable = sum(1 for row in status.offline if row["live_isr"])
        status.problems.append(
            f"{plural(len(status.offline), 'partition')} offline (no live leader): reads and writes fail; "
            f"{electable} with a live in-sync replica to elect, {len(status.offline) - electable} waiting for "
            "a replica to come back")
    if status.under_replicated:
        status.problems.append(f"{plural(len(status.under_replicated), 'partition')} under-replicated")
    if status.below_min_insync:
        status.problems.append(f"{plural(len(status.below_min_insync), 'partition')} below min_insync: acks=all writes "
                               "are refused")
    if not live:
        status.problems.append("no storage node is up")
    if status.strict_order_topics and status.sequencer is None:
        status.problems.append(f"no active sequencer: writes to "
                               f"{plural(status.strict_order_topics, 'strict-order topic')} fail")
    return status


def add_groups(status: Status, bootstrap_value: str, timeout_ms: int = LIST_OFFSETS_TIMEOUT_MS) -> None:
    """Consumer groups with their lag, from the nodes that coordinate them. Lag is shown,
    not judged: a consumer that is behind is not a cluster fault."""
    from fabric import errors
    from sdk import Admin

    if not any(n["up"] for n in status.nodes):
        return
    try:
        with Admin(bootstrap_value, request_timeout_ms=timeout_ms) as admin:
            listings = admin.list_groups()
            status.groups = []
            for listing in listings[:GROUPS_DESCRIBED_MAX]:
                row: dict[str, Any] = {"group_id": listing.group_id, "state": listing.state,
                                       "members": listing.members, "lag": None}
                try:
                    described = admin.describe_group(listing.group_id)
                    # The partitions with a commit: one without has no lag (None), as in
                    # Kafka; a group with no commit at all has no lag to show ("?").
                    known = [o.lag for o in described.offsets if o.lag is not None]
                    row["lag"] = sum(known) if known else None
                    row["partitions"] = len(described.offsets)
                except errors.FabricError as exc:
                    row["error"] = exc.message
                status.groups.append(row)
            if len(listings) > GROUPS_DESCRIBED_MAX:
                status.groups_error = f"{len(listings) - GROUPS_DESCRIBED_MAX} more groups not described"
    except errors.FabricError as exc:
        status.groups_error = f"groups unavailable: {exc.message}"


def _group_lines(status: Status) -> list[str]:
    if status.groups is None:
        return []
    lines = [f"groups      {len(status.groups)}" + (f" ({status.groups_error})" if status.groups_error else "")]
    for g in status.groups:
        lag = "?" if g["lag"] is None else f"{g['lag']:,}"
        lines.append(f"  {g['group_id']:<28}  {g['state']:<11}  members {g['members']:>3}  lag {lag}")
    return lines


def _uptime(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    hours, rest = divmod(max(0, seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _partition_lines(title: str, rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = [f"{title} ({len(rows)}):"]
    for row in rows[:LISTED_PARTITIONS_MAX]:
        extra = f" missing {row['missing']}" if "missing" in row else ""
        if "live_isr" in row:
            extra += f" live in-sync {row['live_isr']}" if row["live_isr"] else " no live in-sync replica"
        if "adding" in row:
            extra += f" adding {row['adding']} removing {row['removing']}"
        lines.append(f"  {row['topic']}/{row['partition']}  leader {row['leader']}  epoch {row['leader_epoch']}  "
                     f"replicas {row['replicas']}  isr {row['isr']}{extra}")
    if len(rows) > LISTED_PARTITIONS_MAX:
        lines.append(f"  ... and {len(rows) - LISTED_PARTITIONS_MAX} more (--json lists all)")
    return lines


def _sequencer_line(status: Status) -> str:
    if status.sequencer is None:
        return "none active" + (f" (strict-order topics: {status.strict_order_topics})" if status.strict_order_topics
                                else " (needed only by strict-order topics)")
    metrics = status.sequencer.get("metrics_address")
    return (f"instance {status.sequencer.get('sequencer_id')} at {status.sequencer.get('address')}, "
            f"epoch {status.sequencer_epoch}" + (f", metrics {metrics}" if metrics else ""))


def render(status: Status) -> str:
    up = sum(1 for n in status.nodes if n["up"])
    verdict = "HEALTHY" if status.healthy else f"UNHEALTHY ({plural(len(status.problems), 'problem')})"
    lines = [
        f"cluster     zk://{status.zookeeper}   {verdict}",
        f"controller  {'node ' + str(status.controller) if status.controller is not None else 'none'}",
        f"sequencer   {_sequencer_line(status)}",
        f"nodes       {up} up, {len(status.nodes) - up} down",
        f"  {'id':>4}  {'state':<5}  {'address':<28}  {'leaders':>7}  {'replicas':>8}  {'uptime':>8}  {'version':<8}",
    ]
    for n in status.nodes:
        lines.append(f"  {n['id']:>4}  {'up' if n['up'] else 'DOWN':<5}  {n['address'] or '-':<28}  "
                     f"{n['leaders']:>7}  {n['replicas']:>8}  {_uptime(n['uptime_s']):>8}  {n['version'] or '-':<8}"
                     f"{'  (controller)' if n['controller'] else ''}")
    lines.append(f"partitions  {status.partitions} in {plural(status.topics, 'topic')}: {len(status.offline)} offline, "
                 f"{len(status.under_replicated)} under-replicated, {len(status.below_min_insync)} below min_insync")
    lines += _partition_lines("offline", status.offline)
    lines += _partition_lines("under-replicated", status.under_replicated)
    lines += _partition_lines("below min_insync", status.below_min_insync)
    lines += _partition_lines("reassigning", status.reassigning)
    lines += _group_lines(status)
    lines += queue_lines(status)
    if status.problems:
        lines.append("problems:")
        lines += [f"  - {p}" for p in status.problems]
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    import logging

    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    from fabric import zk as zkl

    # kazoo's own connection warnings would repeat what the exit code and message say.
    logging.getLogger("kazoo.client").setLevel(logging.ERROR)
    hosts = _zk_hosts(bootstrap(args, check=False))
    zk = KazooClient(hosts=hosts, timeout=max(args.timeout, 1.0), connection_retry={"max_tries": 1})
    close = True
    try:
        try:
            zk.start(timeout=args.timeout)
            status = collect(zk, hosts, timeout_s=args.timeout)
        except (KazooTimeoutError, KazooException, TimeoutError):
            reason = f"ZooKeeper at {hosts} did not answer within {args.timeout:g} s"
            if args.json:  # scripts reading stdout get an answer too
                print(json.dumps({"healthy": False, "zookeeper": hosts, "problems": [reason]}))
            # Not a CliError: its exit code is 3 (documented: "the cluster cannot be asked"),
            # its line the one every failure has (docs/PROTOCOL.md section 13).
            print(f"fabric: error: {reason}", file=sys.stderr)
            return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        # Ctrl-C exits now: closing would wait for kazoo's connection thread, which can sit
        # in a connect attempt for up to --timeout; its threads are daemons and die with us.
        close = False
        raise
    finally:
        if close:
            zkl.close_client(zk)
    if not args.no_groups:
        add_groups(status, bootstrap(args))
        add_queues(status, bootstrap(args), LIST_OFFSETS_TIMEOUT_MS)
    print(json.dumps(status.as_json()) if args.json else render(status))
    return EXIT_HEALTHY if status.healthy else EXIT_UNHEALTHY

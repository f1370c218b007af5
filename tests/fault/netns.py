"""Network namespaces for partition tests: one namespace per storage node, joined by veth
pairs to a bridge in the test's namespace, where ZooKeeper and the clients live.

    test namespace:  bridge <tag>br  10.A.B.1 (clients)  10.A.B.2 (ZooKeeper)
    node i:          namespace <tag>n<i>, veth <tag>p<i>  10.A.B.(10+i)

``isolate(i)`` drops, inside node i's namespace only, every packet to or from ZooKeeper
and the other nodes (iptables); the clients' address still reaches it, so a test can
watch what an isolated leader acknowledges. Everything is named with a random tag and
removed by ``close()`` (the context manager's exit), also after a failure; removing a
namespace removes its veth end and its iptables rules with it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
from types import TracebackType

COMMAND_TIMEOUT_S = 10.0


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install.sh installs it)"
    probe = f"fbprobe{os.getpid() % 100000}"
    try:
        _run("ip", "netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _run("ip", "netns", "exec", probe, "iptables", "-S")
    except RuntimeError as exc:
        return f"iptables does not work inside a namespace: {exc}"
    finally:
        with contextlib.suppress(RuntimeError):
            _run("ip", "netns", "del", probe)
    return None


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


class Network:
    def __init__(self, node_ids: list[int]) -> None:
        rng = random.SystemRandom()
        self.tag = f"fb{rng.randrange(16**4):04x}"  # interface names must fit in 15 bytes
        self.prefix = f"10.{rng.randrange(200, 250)}.{rng.randrange(256)}"
        self.bridge = f"{self.tag}br"
        self.client_ip = f"{self.prefix}.1"
        self.zk_ip = f"{self.prefix}.2"
        self.node_ids = node_ids
        self.created: list[str] = []  # namespaces, for cleanup
        self.bridge_up = False

    def namespace(self, node_id: int) -> str:
        return f"{self.tag}n{node_id}"

    def ip(self, node_id: int) -> str:
        return f"{self.prefix}.{10 + node_id}"

    def open(self) -> Network:
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self.bridge_up = True
            _run("ip", "addr", "add", f"{self.client_ip}/24", "dev", self.bridge)
            _run("ip", "addr", "add", f"{self.zk_ip}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for node_id in self.node_ids:
                ns = self.namespace(node_id)
                outer, inner = f"{self.tag}v{node_id}", f"{self.tag}p{node_id}"
                _run("ip", "netns", "add", ns)
                self.created.append(ns)
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                _run("ip", "link", "set", inner, "netns", ns)
                _run("ip", "link", "set", outer, "master", self.bridge, "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.ip(node_id)}/24", "dev", inner)
                _run("ip", "-n", ns, "link", "set", inner, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def isolate(self, node_id: int, *, from_nodes: bool = True) -> None:
        """Cut node ``node_id`` off from ZooKeeper and (``from_nodes``) from every other
        node, both ways."""
        ns = self.namespace(node_id)
        peers = [self.zk_ip] + ([self.ip(n) for n in self.node_ids if n != node_id] if from_nodes else [])
        for peer in peers:
            _run("ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-s", peer, "-j", "DROP")
            _run("ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-d", peer, "-j", "DROP")

    def heal(self, node_id: int) -> None:
        _run("ip", "netns", "exec", self.namespace(node_id), "iptables", "-F")

    def close(self) -> None:
        for ns in self.created:
            with contextlib.suppress(RuntimeError):
                _run("ip", "netns", "del", ns)
        self.created = []
        if self.bridge_up:
            with contextlib.suppress(RuntimeError):
                _run("ip", "link", "del", self.bridge)
            self.bridge_up = False

    def __enter__(self) -> Network:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

"""The keys and credentials of a local secure cluster (``fabric up --secure``, the tests).

Everything lives in one directory of the cluster (``<data>/security``), files 0600:

* ``cluster.key`` / ``cluster.key_secret``: the server key every node holds;
* ``node-N.key_secret``: each node's own key, registered with role ``node``;
* ``admin.key_secret``: the operator's key, registered with role ``super``;
* ``zk.digest``: the ZooKeeper credential that owns Fabric's znodes;
* ``zk-direct.digest``: the credential for services and callers of the direct plane,
  which may write its registry and nothing else.

Keys are made once and reused when the cluster restarts on the same directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kazoo.client import KazooClient

from fabric.auth import store
from fabric.auth.acl import Role
from fabric.auth.curve import ENV_KEY_FILE, ENV_SERVER_KEY, ClientSecurity
from fabric.auth.keys import SECRET_SUFFIX, generate_key_pair, load_key_pair
from fabric.zk import close_client

CLUSTER_KEY = "cluster"
OPERATOR = "admin"
DIGEST_FILE = "zk.digest"
DIRECT_DIGEST_FILE = "zk-direct.digest"  # the direct plane's registry only (store.open_direct_registry)
ENV_ZK_DIGEST_FILE = "FABRIC_ZK_DIGEST_FILE"


@dataclass
class LocalSecurity:
    directory: Path
    zk_address: str

    @classmethod
    def create(cls, directory: Path, zk_address: str) -> LocalSecurity:
        security = cls(directory, zk_address)
        directory.mkdir(parents=True, exist_ok=True)
        digest_path = directory / DIGEST_FILE
        if not digest_path.exists():
            store.write_digest(digest_path)
        direct_path = directory / DIRECT_DIGEST_FILE
        if not direct_path.exists():
            store.write_digest(direct_path, user=store.DIRECT_DIGEST_USER)
        security.key_file(CLUSTER_KEY)
        security.register(OPERATOR, Role.SUPER)
        zk = security.connect()
        try:
            store.open_direct_registry(zk, store.read_digest(digest_path), store.read_digest(direct_path))
        finally:
            close_client(zk)
        return security

    @property
    def digest_file(self) -> Path:
        return self.directory / DIGEST_FILE

    @property
    def direct_digest_file(self) -> Path:
        return self.directory / DIRECT_DIGEST_FILE

    @property
    def server_key_file(self) -> Path:
        return self.key_file(CLUSTER_KEY)

    @property
    def server_public_key_file(self) -> Path:
        return self.directory / f"{CLUSTER_KEY}.key"

    def key_file(self, name: str) -> Path:
        """``NAME.key_secret`` in the directory, made when missing."""
        path = self.directory / f"{name}{SECRET_SUFFIX}"
        if not path.exists():
            generate_key_pair(self.directory, name)
        return path

    def connect(self) -> KazooClient:
        return store.connect(self.zk_address, store.read_digest(self.digest_file))

    def register(self, name: str, role: Role = Role.USER) -> Path:
        """Make ``name``'s key pair and register it (idempotent); its secret key file."""
        path = self.key_file(name)
        public_key = load_key_pair(path).public_key.decode("ascii")
        zk = self.connect()
        try:
            known = {p.name: p for p in store.list_principals(zk)}
            if name in known and (known[name].public_key != public_key or known[name].role != role):
                store.remove_principal(zk, name)
                known.pop(name)
            if name not in known:
                store.add_principal(zk, name, public_key, role)
        finally:
            close_client(zk)
        return path

    def node_args(self, node_id: int) -> list[str]:
        """The node options of a secure node (its key registered with role node)."""
        key = self.register(f"node-{node_id}", Role.NODE)
        return ["--security", "curve", "--server-key-file", str(self.server_key_file), "--key-file", str(key),
                "--zk-digest-file", str(self.digest_file)]

    def sequencer_args(self) -> list[str]:
        return ["--server-key-file", str(self.server_key_file), "--zk-digest-file", str(self.digest_file)]

    def client(self, name: str = OPERATOR) -> ClientSecurity:
        """A registered principal's client security (the operator's by default)."""
        return ClientSecurity.from_files(self.key_file(name), self.server_public_key_file)

    def service_environment(self, name: str) -> dict[str, str]:
        """What a direct-plane service or caller running as ``name`` needs: its key and the
        direct registry's credential (not the operator's digest)."""
        return {ENV_KEY_FILE: str(self.key_file(name)), ENV_SERVER_KEY: str(self.server_public_key_file),
                ENV_ZK_DIGEST_FILE: str(self.direct_digest_file)}

    def environment(self, name: str = OPERATOR) -> dict[str, str]:
        """What a shell needs to use the cluster as ``name`` (SDK, CLI, C client)."""
        return {ENV_KEY_FILE: str(self.key_file(name)), ENV_SERVER_KEY: str(self.server_public_key_file),
                ENV_ZK_DIGEST_FILE: str(self.digest_file)}

"""Security: CURVE keys, principals, ACLs and the authorizer (docs/SECURITY.md).

* ``fabric.auth.keys``   key pair files (``fabric keys generate``)
* ``fabric.auth.acl``    principals, ACL entries, the pure ``Authorizer`` and the table of
                         what each request needs (``required_access``)
* ``fabric.auth.store``  principals and ACLs in ZooKeeper, the watched ``SecurityCache``,
                         ZooKeeper digest ACLs
The commands ``fabric keys|principal|acl`` are in ``fabric/cli/security.py``.
"""

from fabric.auth.acl import (
    AclEntry,
    Authorizer,
    Operation,
    Principal,
    Resource,
    ResourceType,
    Role,
    required_access,
)

__all__ = [
    "AclEntry",
    "Authorizer",
    "Operation",
    "Principal",
    "Resource",
    "ResourceType",
    "Role",
    "required_access",
]

"""Fabric core: wire protocol, record-batch format, errors, limits, ZooKeeper layout, CLI.

Everything every Fabric process shares lives here. The protocol subpackage is pure
(bytes in, values out): no sockets, threads or clocks, so it is fuzzed and unit tested
without I/O and mirrored by the C client in ``sdk/c``.
"""

__version__ = "0.1.0"

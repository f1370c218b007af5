"""The package rules of docs/DESIGN.md ("Packages and who may import whom"), checked.

Every ``.py`` file of the project's packages is parsed with ``ast`` (no import is
executed), and every import is collected: module level, inside functions and under
``if TYPE_CHECKING``, relative imports resolved, and ``importlib.import_module("...")``
with a literal name. Each importing module then has to stay inside its layer's
allowance. Third-party and standard-library imports are not this test's business.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fabric", "nodes", "sequencer", "sdk", "spark_connector", "bench")
FIRST_PARTY = frozenset(PACKAGES)

# The top layer inside ``fabric/``: the command line and the local-cluster harness.
TOP_OF_FABRIC = ("fabric.cli", "fabric.local", "fabric.__main__")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules[_module_name(path)] = path
    return modules


MODULES = _project_modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every first-party module that ``name`` imports, wherever the import statement sits."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    package_parts = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package_parts[: len(package_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                # ``from fabric import cli`` imports the module fabric.cli, not just fabric.
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return {m for m in found if m.split(".")[0] in FIRST_PARTY}


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _is_core(module: str) -> bool:
    """A module of ``fabric/`` below the top layer: protocol, errors, limits, zk, transport..."""
    return _within(module, ("fabric",)) and not _within(module, TOP_OF_FABRIC)


def _allowed(importer: str, imported: str) -> bool:
    if _is_core(importer):
        return _is_core(imported)
    if _within(importer, TOP_OF_FABRIC):
        return True
    if _within(importer, ("nodes", "sequencer", "sdk")):
        own = importer.split(".")[0]
        return _is_core(imported) or _within(imported, (own,))
    if _within(importer, ("spark_connector.examples",)):
        # Example pipelines are programs a user runs: they may start a local cluster.
        return _within(imported, ("spark_connector", "sdk", "fabric"))
    if _within(importer, ("spark_connector",)):
        return _is_core(imported) or _within(imported, ("spark_connector", "sdk"))
    if _within(importer, ("bench",)):
        # Benchmarks drive clusters from outside: the SDK, the harness, the connector;
        # never the node's or the sequencer's internals.
        return _within(imported, ("bench", "fabric", "sdk", "spark_connector"))
    raise AssertionError(f"{importer} belongs to no layer: add its package to the rules")


def _violations() -> list[str]:
    bad = []
    for name, path in sorted(MODULES.items()):
        for imported in sorted(_imports(name, path)):
            if not _allowed(name, imported):
                bad.append(f"{path.relative_to(ROOT)}: {name} imports {imported}")
    return bad


def test_every_package_keeps_to_its_layer() -> None:
    assert _violations() == []


def test_the_core_list_covers_the_named_core_modules() -> None:
    for core in ("fabric.protocol", "fabric.protocol.batch", "fabric.errors", "fabric.limits", "fabric.zk", "fabric.transport"):
        assert core in MODULES
        assert _is_core(core)
    assert not _is_core("fabric.cli") and not _is_core("fabric.local")


@pytest.mark.parametrize(
    ("importer", "source", "imported"),
    [
        ("fabric.zk", "def f():\n    from sdk import Admin\n", "sdk"),
        ("fabric.protocol.batch", "from fabric import cli\n", "fabric.cli"),
        ("fabric.errors", "import importlib\nimportlib.import_module('nodes.server')\n", "nodes.server"),
        ("nodes.log", "from fabric.local import LocalCluster\n", "fabric.local"),
        ("sdk.producer", "from nodes import log\n", "nodes.log"),
        ("sequencer", "from sdk import Producer\n", "sdk"),
        ("spark_connector", "from nodes.log import Store\n", "nodes.log"),
    ],
)
def test_the_checker_catches_a_forbidden_import(tmp_path: Path, importer: str, source: str, imported: str) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    found = _imports(importer, path)
    assert imported in found
    assert not _allowed(importer, imported)


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("from . import errors\nfrom .protocol import apis\n")
    assert _imports("fabric.zk", path) == {"fabric.errors", "fabric.protocol.apis"}

"""The shape of the code that docs/concepts.md and the contributors' guide promise: small
modules, and no import circle in ``eosink/`` nor inside a built-in sink's package
(``plugins/<package>/``).

An import counts wherever it is written (module level, inside a function, or under
``TYPE_CHECKING``): a circle that a deferred import hides is still a circle to the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "eosink"

PROTOCOL_LIMIT = 400  # eosink/_protocol/ and the rules it applies
CORE_LIMIT = 600  # every other module of eosink/, the CLI's included
PLUGINS = ROOT.parent / "plugins"
PLUGIN_LIMIT = 400  # a module of a built-in sink: one job each
# Modules of the built-in sinks not split yet, and the size they may not grow past.
PLUGIN_NOT_SPLIT = {"eosink_file/_rolling.py": 915, "eosink_file/options.py": 434}


def _modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module of ``eosink`` -> the modules of ``eosink`` it imports."""

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package[: len(package) - node.level + 1], base]).strip(".")
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = known(name)
                if target is not None and target != mod:
                    graph[mod].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_core() -> None:
    graph = _imports(_modules())
    circles = _circles(graph)
    told = ["; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in circles]
    assert not circles, "import circles in eosink/:\n" + "\n".join(told)


def test_the_check_sees_a_circle() -> None:
    """The circle check can fail: a deferred import back up the chain is one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    real = _imports(_modules())
    # deferred (inside a function) and TYPE_CHECKING imports count
    assert "eosink._datasource" in real["eosink._session"]
    assert "eosink._protocol.epoch" in real["eosink._write"]


def test_module_sizes() -> None:
    too_big = []
    for mod, path in sorted(_modules().items()):
        lines = len(path.read_text().splitlines())
        protocol = mod.startswith("eosink._protocol") or mod.startswith("eosink._rules")
        limit = PROTOCOL_LIMIT if protocol else CORE_LIMIT
        if lines > limit:
            too_big.append(f"{path.relative_to(ROOT.parent)}: {lines} lines (limit {limit})")
    assert not too_big, "modules over their size limit:\n" + "\n".join(too_big)


def _plugin_packages() -> list[Path]:
    return sorted(p.parent for p in PLUGINS.glob("*/__init__.py"))


def test_no_import_circle_inside_a_plugin() -> None:
    """No module of a built-in sink imports, directly or not, one that imports it back (a
    deferred import counts)."""
    packages = _plugin_packages()
    assert {p.name for p in packages} >= {"eosink_file", "eosink_iceberg", "eosink_kafka"}
    told = []
    for package in packages:
        graph = _imports(_modules(package))
        told += [f"{package.name}: {' <-> '.join(c)}" for c in _circles(graph)]
    assert not told, "import circles inside plugins:\n" + "\n".join(told)


def test_the_plugin_graph_sees_relative_imports() -> None:
    """The plugin graph sees a package's relative imports: the iceberg coordinator's."""
    graph = _imports(_modules(PLUGINS / "eosink_iceberg"))
    assert "eosink_iceberg.upsert" in graph["eosink_iceberg.coordinator"]
    assert "eosink_iceberg.native_plan" in graph["eosink_iceberg.native"]


def test_plugin_module_sizes() -> None:
    """A module of a built-in sink has one job, in at most PLUGIN_LIMIT lines; one not split
    yet may not grow."""
    too_big = []
    for package in _plugin_packages():
        for path in sorted(package.rglob("*.py")):
            rel = path.relative_to(PLUGINS).as_posix()
            lines = len(path.read_text().splitlines())
            limit = PLUGIN_NOT_SPLIT.get(rel, PLUGIN_LIMIT)
            if lines > limit:
                too_big.append(f"plugins/{rel}: {lines} lines (limit {limit})")
    assert not too_big, "plugin modules over their size limit:\n" + "\n".join(too_big)
    for rel in PLUGIN_NOT_SPLIT:  # a module split since: take it off the list
        assert len((PLUGINS / rel).read_text().splitlines()) > PLUGIN_LIMIT, rel

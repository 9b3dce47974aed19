"""The shape of the core that docs/concepts.md and the contributors' guide promise: small
modules, and no import circle in ``eosink/``.

An import counts wherever it is written (module level, inside a function, or under
``TYPE_CHECKING``): a circle that a deferred import hides is still a circle to the reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "eosink"

PROTOCOL_LIMIT = 400  # eosink/_protocol/ and the rules it applies
CORE_LIMIT = 600  # every other module of eosink/, the CLI's included


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
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

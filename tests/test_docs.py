"""The docs build without warnings, and the README starts with the two promised commands."""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "site" / "plugins" / "index.html").exists()


def test_readme_opens_with_demo_and_test_commands() -> None:
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("python3")]
    assert "eosink demo" in lines[0]
    assert "pytest" in lines[1]
    assert lines[1].split("&& ", 1)[1] in (ROOT / ".ci" / "run").read_text()


def test_plugin_docs_ship_the_example_plugin_verbatim() -> None:
    """Plugin authors copy the example from the docs: it must be the tested source."""
    src = (ROOT / "tests" / "example_plugin" / "eosink_example" / "__init__.py").read_text()
    assert f"```python\n{src}```" in (ROOT / "docs" / "plugins.md").read_text()


# -- docstrings of the public API, and the plugin docs of every hook ----------------------------
def _public_modules() -> list[ModuleType]:
    """``eosink`` and every module of it whose name does not start with ``_``."""
    import eosink

    names = ["eosink"] + [
        f"eosink.{m.name}" for m in pkgutil.iter_modules(eosink.__path__) if m.name[0] != "_"
    ]
    return [importlib.import_module(n) for n in names]


def _attribute_docstrings() -> dict[str, str]:
    """Module-level ``NAME = ...`` followed by a string literal (an attribute docstring), in
    every module of eosink: constants and re-exported objects cannot carry ``__doc__``."""
    docs: dict[str, str] = {}
    for path in sorted((ROOT / "eosink").rglob("*.py")):
        body = ast.parse(path.read_text()).body
        for stmt, nxt in itertools.pairwise(body):
            targets = (
                stmt.targets
                if isinstance(stmt, ast.Assign)
                else [stmt.target]
                if isinstance(stmt, ast.AnnAssign)
                else []
            )
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                for t in targets:
                    if isinstance(t, ast.Name) and nxt.value.value.strip():
                        docs.setdefault(t.id, nxt.value.value)
    return docs


def _own_doc(obj: Any) -> str:
    """``obj``'s docstring, ignoring the signature a dataclass makes up when it has none."""
    doc = inspect.getdoc(obj) or ""
    name = getattr(obj, "__name__", "")
    return "" if inspect.isclass(obj) and doc.startswith(f"{name}(") else doc


def test_public_api_has_docstrings() -> None:
    """Every name in the ``__all__`` of ``eosink`` and of its public modules is documented,
    and so is every public method and property of the public classes (a docstring inherited
    from an eosink base class counts)."""
    attribute_docs = _attribute_docstrings()
    missing: list[str] = []
    for mod in _public_modules():
        assert hasattr(mod, "__all__"), f"{mod.__name__} has no __all__"
        if not (mod.__doc__ or "").strip():
            missing.append(mod.__name__)
        for name in mod.__all__:
            obj = getattr(mod, name)
            where = f"{mod.__name__}.{name}"
            if not (inspect.isclass(obj) or callable(obj)):  # constants, markers
                if name not in attribute_docs:
                    missing.append(f"{where} (no docstring after its assignment)")
                continue
            if not _own_doc(obj):
                missing.append(where)
            if not inspect.isclass(obj) or not obj.__module__.startswith("eosink"):
                continue
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if not (callable(member) or isinstance(member, (property, classmethod))):
                    continue  # dataclass fields and class-level settings
                if not inspect.getdoc(getattr(obj, attr)):
                    missing.append(f"{where}.{attr}")
    assert missing == [], "undocumented public API:\n" + "\n".join(sorted(set(missing)))


def _hookspecs() -> list[Any]:
    from eosink import hookspecs

    return [
        f for f in vars(hookspecs).values() if inspect.isfunction(f) and hasattr(f, "eosink_spec")
    ]


def test_every_hookspec_is_documented_in_plugins_md() -> None:
    """docs/plugins.md has a ``### `<hook>``` section per hookspec, describing it (at least a
    few sentences) and naming each of its arguments; the hookspec has a docstring too."""
    specs = _hookspecs()
    assert {f.__name__ for f in specs} >= {"eosink_sinks", "eosink_epoch_committed"}
    text = (ROOT / "docs" / "plugins.md").read_text()
    for f in specs:
        assert inspect.getdoc(f), f"hookspec {f.__name__} has no docstring"
        m = re.search(rf"^### `{f.__name__}`\n\n(.+?)(?=^#|\Z)", text, re.M | re.S)
        assert m, f"docs/plugins.md has no section '### `{f.__name__}`'"
        section = m.group(1)
        assert len(section.split()) >= 30, f"docs/plugins.md: {f.__name__} is hardly described"
        for arg in inspect.signature(f).parameters:
            assert f"`{arg}`" in section, f"docs/plugins.md: {f.__name__} never names `{arg}`"


def test_every_conformance_check_is_documented_in_plugins_md() -> None:
    """Plugin authors read what the suite checks, and why, in docs/plugins.md."""
    from eosink.testing import SinkConformance

    text = (ROOT / "docs" / "plugins.md").read_text()
    checks = [n for n in dir(SinkConformance) if n.startswith("test_")]
    assert len(checks) >= 10
    assert [n for n in checks if f"| `{n}` |" not in text] == []

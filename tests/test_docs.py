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

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs built once with ``mkdocs build --strict``: any warning fails the build, and
    so does a ``::: name`` that mkdocstrings cannot collect, a docstring griffe cannot parse
    (a documented argument the signature lacks...) and a cross-reference autorefs cannot
    resolve."""
    out = tmp_path_factory.mktemp("docs") / "site"
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def test_mkdocs_builds_strict(site: Path) -> None:
    assert (site / "plugins" / "index.html").exists()
    assert (site / "api" / "index.html").exists()


def test_api_reference_covers_the_public_api(site: Path) -> None:
    """docs/api.md renders every name of the ``__all__`` of ``eosink`` and of its public
    modules, under the name users import it by (``eosink.X``) or its module's."""
    html = (site / "api" / "index.html").read_text()
    anchors = set(re.findall(r'id="(eosink[\w.]*)"', html))
    modules = _public_modules()
    not_rendered = {"eosink.hookspecs.hookspec"}  # eosink's own marker of its hookspecs
    missing = []
    for mod in modules:
        for name in mod.__all__:
            where = f"{mod.__name__}.{name}"
            ids = {where, f"eosink.{name}"} | {f"{m.__name__}.{name}" for m in modules}
            if where not in not_rendered and not ids & anchors:
                missing.append(where)
    assert missing == [], "not in docs/api.md:\n" + "\n".join(sorted(missing))


def test_api_reference_renders_docstrings_as_markdown(site: Path) -> None:
    """The docstrings' Sphinx roles became links and ``::`` a colon (docs/_ext/sphinx_roles.py),
    ``Contract:`` sections are lists, and the objects' cross-references are links."""
    html = (site / "api" / "index.html").read_text()
    assert not re.search(r":(?:class|func|meth|attr|data|exc|mod|obj):`", html)
    assert not re.search(r"\w::(?:<|\s*$)", html, re.M)
    assert "][eosink." not in html  # a link inside a code block stays as typed
    assert html.count('<details class="contract" open>') >= 5
    assert 'href="#eosink.Prepared"' in html
    assert 'href="#eosink.errors.SchemaMismatchError"' in html


def test_readme_opens_with_demo_and_test_commands() -> None:
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("python3")]
    assert "eosink demo" in lines[0]
    assert "pytest" in lines[1]
    assert lines[1].split("&& ", 1)[1] in (ROOT / ".ci" / "run").read_text()


def test_plugin_docs_ship_the_example_plugin_verbatim() -> None:
    """Plugin authors copy the example from the docs: it must be the tested source."""
    src = (ROOT / "tests" / "example_plugin" / "eosink_example" / "__init__.py").read_text()
    assert f"```python\n{src}```" in (ROOT / "docs" / "plugins.md").read_text()


def test_api_reference_error_tree_is_the_hierarchy() -> None:
    """The tree of docs/api.md names every error of ``eosink.errors`` under its eosink base
    class, with its other bases and ``transient`` as the classes say."""
    from eosink import errors

    text = (ROOT / "docs" / "api.md").read_text()
    tree = text.split("```text\nEosinkError\n", 1)[1].split("```", 1)[0]
    shown: dict[str, tuple[str, str]] = {}
    parents = ["EosinkError"]
    for line in tree.splitlines():
        m = re.fullmatch(r"([│ ]*)[├└]── (\w+)(?: \((.+)\))?", line)
        assert m, line
        depth = len(m.group(1)) // 4
        parents[depth + 1 :] = [m.group(2)]
        shown[m.group(2)] = (parents[depth], m.group(3) or "")
    for name in errors.__all__:
        cls = getattr(errors, name)
        if cls is errors.EosinkError:
            continue
        base = next(b for b in cls.__bases__ if issubclass(b, errors.EosinkError))
        notes = [b.__name__ for b in cls.__bases__ if not issubclass(b, errors.EosinkError)]
        notes += ["transient"] if cls.transient and not base.transient else []
        assert shown.get(name) == (base.__name__, ", ".join(notes)), name
    assert set(shown) == set(errors.__all__) - {"EosinkError"}


def test_plugin_docs_examples_type_check(tmp_path: Path) -> None:
    """Every Python example of docs/plugins.md, the complete plugin included, is a module
    that passes ``mypy --strict`` against this eosink (``...`` standing for a body is
    allowed). A canary module with a known error proves that eosink's types were seen (with
    ``--ignore-missing-imports`` an eosink mypy cannot find would be ``Any`` and pass)."""
    text = (ROOT / "docs" / "plugins.md").read_text()
    example = (ROOT / "tests" / "example_plugin" / "eosink_example" / "__init__.py").read_text()
    files = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S):
        line = text.count("\n", 0, m.start(1)) + 1
        f = tmp_path / f"plugins_md_line_{line}.py"  # its line k is line + k - 1 of the doc
        f.write_text(m.group(1))
        files.append(f)
    assert example in [f.read_text() for f in files], "the complete example is not a block"
    assert len(files) >= 5
    canary = tmp_path / "canary.py"
    canary.write_text("import eosink\n\nx: int = eosink.Prepared(0)\n")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--ignore-missing-imports",
            "--disable-error-code=empty-body",
            "--no-error-summary",
            f"--cache-dir={ROOT / '.mypy_cache' / 'docs-examples'}",
            *map(str, [*files, canary]),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    errors = [ln for ln in res.stdout.splitlines() if ": error:" in ln]
    assert [e.split(":")[0] for e in errors] == ["canary.py"], res.stdout + res.stderr


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


def test_recovery_rules_cited_in_the_code_exist() -> None:
    """Code comments cite docs/concepts.md's recovery rules by number: each number cited must
    be a rule there (the rules are numbered once, in that page)."""
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    section = concepts.split("## Recovery", 1)[1].split("\n## ", 1)[0]
    rules = {int(n) for n in re.findall(r"^(\d+)\. ", section, re.M)}
    assert rules == set(range(1, max(rules) + 1)), rules
    cited: dict[str, set[int]] = {}
    for path in [*ROOT.glob("eosink/**/*.py"), *ROOT.glob("plugins/**/*.py")]:
        for m in re.finditer(r"\brules? (\d+)(?: (?:to|and|-) (\d+))?", path.read_text()):
            nums = {int(g) for g in m.groups() if g}
            cited.setdefault(str(path.relative_to(ROOT)), set()).update(nums)
    assert cited, "no rule citations found: the pattern is wrong"
    wrong = {p: sorted(n - rules) for p, n in cited.items() if n - rules}
    assert not wrong, f"rule numbers cited that docs/concepts.md does not have: {wrong}"


def test_cli_synopsis_lists_every_command_and_option() -> None:
    """docs/cli.md's synopsis names every subcommand of ``eosink`` and each of its options
    (taken from the argparse parser, so a new command or option cannot go undocumented)."""
    import argparse

    from eosink._cli import build_parser

    parser = build_parser()
    text = (ROOT / "docs" / "cli.md").read_text()
    synopsis = text[text.index("```") : text.index("```", text.index("```") + 3)]
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sp in sub.choices.items():
        assert f"eosink {name}" in synopsis, name
        for action in sp._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help":
                    assert opt in synopsis, f"eosink {name} {opt}"


def test_option_tables_cover_the_code() -> None:
    """docs/run.md has a row for every argument of ``eosink.run``, and each built-in sink's
    page names every field of its options model: a new option cannot go undocumented."""
    import eosink

    run_md = (ROOT / "docs" / "run.md").read_text()
    for name in inspect.signature(eosink.run).parameters:
        if name not in ("df", "sink_options"):
            assert f"| `{name}` |" in run_md, f"docs/run.md: no row for {name}"
    from eosink_file.plugin import FileSinkOptions
    from eosink_iceberg.options import IcebergSinkOptions
    from eosink_kafka.options import KafkaSinkOptions
    from eosink_sql.options import SqlSinkOptions

    for model, page in [
        (FileSinkOptions, "file-sink.md"),
        (IcebergSinkOptions, "iceberg.md"),
        (KafkaSinkOptions, "kafka.md"),
        (SqlSinkOptions, "sql.md"),
    ]:
        text = (ROOT / "docs" / page).read_text()
        missing = [n for n in model.model_fields if f"`{n}`" not in text]
        assert not missing, f"docs/{page} does not document {missing}"


def test_run_md_error_samples_are_what_the_code_says() -> None:
    """The sample ConfigErrors of docs/run.md are the messages eosink gives for those
    options today (they once listed 3 formats of 5)."""
    from eosink import ConfigError
    from eosink.registry import get_sink

    sink = get_sink("file")
    given = [
        {"path": "/tmp/x", "format": "xml", "colour": "red"},
        {"path": "/tmp/x", "compression": "zzz"},
    ]
    text = (ROOT / "docs" / "run.md").read_text()
    for options in given:
        with pytest.raises(ConfigError) as err:
            sink.parse_options(options)
        assert f"eosink.errors.ConfigError: {err.value}\n" in text, str(err.value)

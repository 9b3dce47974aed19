"""The docs build without warnings, and the README starts with the two promised commands."""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import json
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
    from eosink_delta.options import DeltaSinkOptions
    from eosink_file.plugin import FileSinkOptions
    from eosink_iceberg.options import IcebergSinkOptions
    from eosink_kafka.options import KafkaSinkOptions
    from eosink_sql.options import SqlSinkOptions

    for model, page in [
        (FileSinkOptions, "file-sink.md"),
        (IcebergSinkOptions, "iceberg.md"),
        (KafkaSinkOptions, "kafka.md"),
        (SqlSinkOptions, "sql.md"),
        (DeltaSinkOptions, "delta.md"),
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


# -- docs that cannot drift: defaults, exit statuses, quoted error texts ------------------------
def _md_blocks(text: str) -> tuple[str, list[tuple[int, str]]]:
    """``text`` with its fenced code blocks blanked (line numbers kept), and the blocks'
    lines (line number, line)."""
    lines = text.split("\n")
    prose, code, fence = [], [], None
    for n, line in enumerate(lines, 1):
        m = re.match(r"\s*(```+|~~~+)", line)
        if fence is None and m:
            fence = m.group(1)
            prose.append("")
        elif fence is not None:
            if line.strip() == fence:
                fence = None
            else:
                code.append((n, line))
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), code


def _cells(row: str) -> list[str]:
    """The cells of a Markdown table row; ``|`` inside backticks or escaped stays."""
    cells, cur, tick = [], "", False
    body = row.strip()
    body = body[1:] if body.startswith("|") else body
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and body[i + 1 : i + 2] == "|":
            cur += "|"
            i += 2
            continue
        if ch == "`":
            tick = not tick
        if ch == "|" and not tick:
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    if cur.strip():
        cells.append(cur.strip())
    return cells


def _tables(text: str) -> list[tuple[int, list[str], list[list[str]]]]:
    """Every Markdown table outside code blocks: (line of its header, header, rows)."""
    prose, _ = _md_blocks(text)
    lines = prose.split("\n")
    out, i = [], 0
    while i < len(lines) - 1:
        if lines[i].lstrip().startswith("|") and re.fullmatch(r"\s*\|[-:| ]+\|?\s*", lines[i + 1]):
            header, rows, j = _cells(lines[i]), [], i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                rows.append(_cells(lines[j]))
                j += 1
            out.append((i + 1, header, rows))
            i = j
        else:
            i += 1
    return out


_REQUIRED = object()
_SIZES = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _documented_default(cell: str) -> tuple[str, Any]:
    """What a "default" cell of an option table claims: ``("required", None)``, ``("none",
    None)`` (None or an empty collection), ``("value", v)`` for a literal (a backticked value,
    a number, ``true``/``false``, ``8 MiB``), or ``("computed", text)`` for a description of
    what the code computes when the option is not given (``boto3's``, ``next free``, a
    template such as `` `$EOSINK_HOME/iceberg` `` or `` `eosink-control-<sink key>` ``)."""
    c = cell.strip()
    if c in ("required", "(required)"):
        return "required", None
    c = re.sub(r"\s*\([^()]*\)$", "", c) or c  # `8388608` (8 MiB): the note is not the value
    if c == "none":
        return "none", None
    m = re.fullmatch(r"`([^`]+)`", c)
    token = m.group(1) if m else c
    if m and re.search(r"\$\w|<[^>]+>", token):
        return "computed", c  # a template of a value computed at run time
    size = re.fullmatch(r"(\d+) (KiB|MiB|GiB)", token)
    if size:
        return "value", int(size.group(1)) * _SIZES[size.group(2)]
    for parse in (json.loads, _doc_value):
        try:
            return "value", parse(token)
        except (ValueError, SyntaxError):
            pass
    if m and re.fullmatch(r"[A-Za-z_][\w.-]*", token):
        return "value", token  # a backticked word: a string
    return "computed", c


def _doc_value(src: str | ast.expr) -> Any:
    """A value the docs write: a Python literal, or ``RestartPolicy(...)`` /
    ``eosink.RestartPolicy(...)`` of literals (built, so it compares with the code's)."""
    import eosink

    node = ast.parse(src, mode="eval").body if isinstance(src, str) else src
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        if name in ("RestartPolicy", "eosink.RestartPolicy") and not node.args:
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
            return eosink.RestartPolicy(**kwargs)
    return ast.literal_eval(node)


def _same_default(claim: tuple[str, Any], actual: Any) -> bool:
    kind, value = claim
    empty = actual is None or (isinstance(actual, (tuple, list, dict, set, str)) and not actual)
    if kind == "required":
        return actual is _REQUIRED
    if actual is _REQUIRED:
        return False
    if kind in ("none", "computed"):
        return empty
    if isinstance(actual, bool) or isinstance(value, bool):
        return type(actual) is type(value) and actual == value
    if isinstance(actual, tuple):
        actual = list(actual)
    return bool(actual == value)


def _code_defaults() -> dict[str, dict[str, Any]]:
    """Per documented page, each option's default in the code (``_REQUIRED`` when it has
    none): the sinks' options models, and ``eosink.run``'s own parameters."""
    import eosink

    params = inspect.signature(eosink.run).parameters.values()
    pages = {
        "run.md": {
            p.name: _REQUIRED if p.default is inspect.Parameter.empty else p.default
            for p in params
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        }
    }
    for page, sink in [
        ("file-sink.md", "file"),
        ("iceberg.md", "iceberg"),
        ("kafka.md", "kafka"),
        ("sql.md", "sql"),
        ("delta.md", "delta"),
    ]:
        fields = eosink.get_sink(sink).options_model.model_fields
        pages[page] = {
            n: _REQUIRED if f.is_required() else f.get_default(call_default_factory=True)
            for n, f in fields.items()
        }
    return pages


def test_option_tables_defaults_are_the_code() -> None:
    """Every option table of the docs (a table whose columns start "option | default") gives
    each option's default as the code has it: a literal equals the default of the sink's
    options model (or of ``eosink.run``'s parameter), "none" and descriptions of a value
    computed at run time stand for None (or an empty collection), "required" for no default;
    and every option it names exists."""
    code = _code_defaults()
    checked, wrong = 0, []
    for path in sorted((ROOT / "docs").glob("*.md")):
        for line, header, rows in _tables(path.read_text()):
            if [h.lower() for h in header[:2]] != ["option", "default"]:
                continue
            assert path.name in code, f"docs/{path.name}:{line}: an option table of no known model"
            defaults = code[path.name]
            for row in rows:
                claim = _documented_default(row[1])
                for name in re.findall(r"`(\w+)`", row[0]):
                    where = f"docs/{path.name}:{line}: {name}"
                    if name not in defaults:
                        wrong.append(f"{where}: no such option in the code")
                    elif not _same_default(claim, defaults[name]):
                        actual = defaults[name]
                        shown = "required" if actual is _REQUIRED else repr(actual)
                        wrong.append(f"{where}: the docs say {row[1]!r}, the code {shown}")
                    checked += 1
    assert not wrong, "option defaults that differ from the code:\n" + "\n".join(wrong)
    assert checked >= 60, checked  # every sink's table and run.md's were found


def test_documented_signatures_are_the_code() -> None:
    """run.md's annotated ``eosink.run(...)`` call gives each keyword its default, and a
    signature quoted in the docs (`` `eosink.spark_session(master=None, ..., *, ...)` ``,
    recognised by its bare ``*``) is the function's."""
    import eosink

    text = (ROOT / "docs" / "run.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block
    call = ast.parse(block.group(1)).body[0].value  # type: ignore[attr-defined]
    params = inspect.signature(eosink.run).parameters
    seen = 0
    for kw in call.keywords:
        if kw.arg is None:
            continue  # **sink_options
        assert kw.arg in params, f"docs/run.md: eosink.run has no parameter {kw.arg}"
        default = params[kw.arg].default
        if default is not inspect.Parameter.empty:
            assert _doc_value(kw.value) == default, f"docs/run.md: {kw.arg}"
            seen += 1
    assert seen >= 8, seen
    sigs = 0
    for path in sorted((ROOT / "docs").glob("*.md")):
        for m in re.finditer(r"`eosink\.(\w+)(\(([^`]*\*,[^`]*)\))`", path.read_text()):
            fn = getattr(eosink, m.group(1))
            doc = ast.parse(f"def f{m.group(2)}: pass").body[0].args  # type: ignore[attr-defined]
            real = ast.parse(f"def f{_unannotated(fn)}: pass").body[0].args  # type: ignore[attr-defined]
            assert ast.dump(doc) == ast.dump(real), (
                f"docs/{path.name}: eosink.{m.group(1)}{m.group(2)} is not "
                f"eosink.{m.group(1)}{_unannotated(fn)}"
            )
            sigs += 1
    assert sigs >= 1


def _unannotated(fn: Any) -> str:
    sig = inspect.signature(fn)
    return str(
        sig.replace(
            parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
            return_annotation=sig.empty,
        )
    )


def _exit_status(argv: list[str]) -> int:
    """``eosink ARGV``'s exit status, in this process (argparse exits by SystemExit)."""
    from eosink._cli import main

    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _file_sink_epoch(out: Path, url: str, epoch: int) -> str:
    """A file sink at ``out`` whose ``epoch`` is PENDING (written by eosink's own task code,
    no Spark), as a batch job killed after phase 1 leaves it; its sink_id."""
    import pyarrow as pa

    from eosink._setup import open_runtime, prepare_sink
    from eosink.testing import drive_writers

    setup = prepare_sink(
        "file", {"path": str(out), "writer": "python"}, streaming=False, metastore_url=url
    )
    rt = open_runtime(setup)
    try:
        ep = rt.batch_epoch(epoch)
        schema = pa.schema([("id", pa.int64())])
        batch = pa.record_batch([pa.array([1, 2, 3])], schema=schema)
        results = drive_writers(
            rt.plugin, rt.options, rt.sink_id, epoch, [[batch]], ep.setup(schema)
        )
        ep.prepare(results, 3, 0.0)
    finally:
        rt.close()
        rt.store.close()
    return setup.sink_id


def _set_owner(url: str, sink_id: str, owner: str, heartbeat_at: float | None) -> None:
    from sqlalchemy import update

    from eosink._metastore import MetaStore
    from eosink._metastore.models import SinkRow

    store = MetaStore(url)
    try:
        with store._tx() as conn:
            conn.execute(
                update(SinkRow)
                .where(SinkRow.sink_id == sink_id)
                .values(owner=owner, heartbeat_at=heartbeat_at)
            )
    finally:
        store.close()


def _demo_failure_status() -> int:
    """What ``eosink demo`` returns when its verification fails, read from its code (running
    it takes a Spark driver): its ``return <ok> if ok else <failed>``."""
    tree = ast.parse((ROOT / "eosink" / "_demo.py").read_text())
    [demo] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "demo"]
    [ret] = [
        r.value
        for r in ast.walk(demo)
        if isinstance(r, ast.Return) and isinstance(r.value, ast.IfExp)
    ]
    assert isinstance(ret.test, ast.Name) and ret.test.id == "ok", ast.dump(ret)
    assert isinstance(ret.orelse, ast.Constant)
    return int(ret.orelse.value)


def test_cli_exit_statuses_are_the_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each row of docs/cli.md's exit status table is run (in this process, no Spark: a file
    sink's epoch is written by eosink's task code) and exits with the status it gives."""
    import socket
    import time

    from eosink._metastore import MetaStore

    monkeypatch.setenv("EOSINK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EOSINK_METASTORE_URL", raising=False)
    host = socket.gethostname()

    def store(name: str) -> str:
        url = f"sqlite:///{tmp_path / name}.db"
        assert _exit_status(["db", "upgrade", "--url", url]) == 0
        return url

    def pending_epoch(url: str, sink_id: str, epoch: int, committed: bool = False) -> None:
        s = MetaStore(url)
        try:
            g = s.acquire(sink_id, "file").generation
            s.persist_pending(
                sink_id,
                g,
                epoch,
                b"{}",
                1,
                rows=3,
                files=1,
                nbytes=5,
                batch_end_at=1.0,
                pre_commit_ms=1.0,
            )
            if committed:
                s.mark_committed(sink_id, g, epoch, commit_ms=1.0)
        finally:
            s.close()

    def recover(out: Path, url: str, *more: str) -> list[str]:
        return ["recover", "--sink", "file", "--option", f"path={out}", "--option",
                "writer=python", "--metastore-url", url, *more]  # fmt: skip

    def abandon(url: str, sink_id: str, epoch: int, *more: str) -> list[str]:
        return ["abandon", "--metastore-url", url, "--sink-id", sink_id, "--epoch", str(epoch),
                "--reason", "test", *more]  # fmt: skip

    def retire(out: Path, url: str, *more: str) -> list[str]:
        return ["retire", "--sink", "file", "--option", f"path={out}", "--metastore-url", url,
                *more]  # fmt: skip

    def done() -> list[int]:
        url = store("ok")
        out = tmp_path / "ok-out"
        _file_sink_epoch(out, url, 1)
        pending_epoch(url, "file:/elsewhere", 3)
        return [
            _exit_status(["db", "current", "--url", url]),
            _exit_status(["plugins"]),
            _exit_status(["plugins", "--json"]),
            _exit_status(["status", "--metastore-url", url]),
            _exit_status(recover(out, url)),  # commits the PENDING epoch
            _exit_status(["status", "--metastore-url", url, "--sink-id", f"file:{out}"]),
            _exit_status(abandon(url, "file:/elsewhere", 3, "--accept-data-loss")),
            _exit_status(retire(out, url, "--dry-run")),
            _exit_status(retire(out, url)),
            _exit_status(["new-sink", "doc_check", "--dir", str(tmp_path / "new")]),
        ]

    def usage() -> list[int]:
        return [
            _exit_status(["no-such-command"]),
            _exit_status(["status", "--no-such-option"]),
            _exit_status(["abandon", "--sink-id", "x"]),  # --epoch and more missing
        ]

    def eosink_error() -> list[int]:
        codes = [
            _exit_status(["status", "--metastore-url", f"sqlite:///{tmp_path}/none/m.db"]),
            _exit_status(["recover", "--sink", "file", "--option", "format=xml"]),
        ]
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 2 and all(e.startswith("eosink: error: ") for e in err), err
        return codes

    def other_error() -> list[int]:
        codes = [_exit_status(["recover", "--sink", "file", "--options-json", "{"])]
        err = capsys.readouterr().err
        assert err.startswith("eosink: error: JSONDecodeError: "), err
        assert err.rstrip().endswith("(run with -v for the traceback)"), err
        return codes

    def status_no_sink() -> list[int]:
        url = store("status")
        capsys.readouterr()
        codes = [_exit_status(["status", "--metastore-url", url, "--sink-id", "nosuch"])]
        assert capsys.readouterr().out == ""
        return codes

    def no_sink() -> list[int]:
        url = store("nosink")
        codes = [
            _exit_status(recover(tmp_path / "nosink-out", url, "--sink-id", "nosuch")),
            _exit_status(abandon(url, "nosuch", 1, "--accept-data-loss")),
            _exit_status(retire(tmp_path / "nosink-out", url, "--sink-id", "nosuch")),
        ]
        assert capsys.readouterr().err.count("has no sink 'nosuch'") == 3
        return codes

    def owner_runs() -> list[int]:
        url = store("owner")
        out = tmp_path / "owner-out"
        sid = _file_sink_epoch(out, url, 1)
        codes = []
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            for owner, beat in [
                (f"{host}:{child.pid}", None),
                ("elsewhere.example:1", time.time()),
            ]:
                _set_owner(url, sid, owner, beat)
                codes += [
                    _exit_status(recover(out, url)),
                    _exit_status(abandon(url, sid, 1, "--accept-data-loss")),
                    _exit_status(retire(out, url)),
                ]
                assert capsys.readouterr().err.count("stop that job first") == 3
        finally:
            child.kill()
            child.wait()
        return codes

    def not_finished() -> list[int]:
        url = store("stuck")
        out = tmp_path / "stuck-out"
        _file_sink_epoch(out, url, 1)
        staged = [p for p in (out / "_eosink_staging").rglob("*") if p.is_file()]
        assert staged
        for p in staged:
            p.unlink()  # behind eosink's back: the PENDING epoch can never be committed
        codes = [_exit_status(recover(out, url))]
        assert "still not finished: [1]" in capsys.readouterr().out
        return codes

    def drop_without_consent() -> list[int]:
        url = store("drop")
        out = tmp_path / "drop-out"
        _file_sink_epoch(out, url, 1)
        codes = [
            _exit_status(recover(out, url, "--drop-lost-open-files")),
            _exit_status(recover(out, url, "--drop-lost-open-files", "--reason", "x")),
            _exit_status(recover(out, url, "--drop-lost-open-files", "--accept-data-loss")),
        ]
        assert capsys.readouterr().err.count("run again with --reason and --accept") == 3
        return codes

    def abandon_not_pending() -> list[int]:
        url = store("committed")
        pending_epoch(url, "file:/c", 1, committed=True)
        codes = [
            _exit_status(abandon(url, "file:/c", 1, "--accept-data-loss")),
            _exit_status(abandon(url, "file:/c", 2, "--accept-data-loss")),
        ]
        assert capsys.readouterr().err.count("only a PENDING epoch") == 2
        return codes

    def abandon_without_consent() -> list[int]:
        url = store("consent")
        pending_epoch(url, "file:/p", 1)
        codes = [_exit_status(abandon(url, "file:/p", 1))]
        assert "run again with --accept-data-loss" in capsys.readouterr().err
        return codes

    def retire_pending() -> list[int]:
        url = store("retire")
        out = tmp_path / "retire-out"
        _file_sink_epoch(out, url, 1)
        codes = [_exit_status(retire(out, url)), _exit_status(retire(out, url, "--dry-run"))]
        assert capsys.readouterr().err.count("PENDING epoch(s) [1]") == 2
        return codes

    def new_sink_refused() -> list[int]:
        taken = tmp_path / "taken" / "eosink-mine"
        taken.mkdir(parents=True)
        (taken / "x").write_text("")
        codes = [
            _exit_status(["new-sink", "Bad-Name", "--dir", str(tmp_path / "n1")]),
            _exit_status(["new-sink", "file", "--dir", str(tmp_path / "n2")]),
            _exit_status(["new-sink", "mine", "--dir", str(tmp_path / "taken")]),
        ]
        assert capsys.readouterr().err.count("eosink: error: ") == 3
        assert not (tmp_path / "n1").exists() and not (tmp_path / "n2").exists()
        return codes

    scenarios: dict[tuple[str, str], Any] = {
        ("any", "it did what was asked"): done,
        ("any", "a usage error"): usage,
        ("any", "an eosink error"): eosink_error,
        ("any", "another error"): other_error,
        ("`status --sink-id ID`", "the meta store has no such sink"): status_no_sink,
        ("`recover`, `abandon`, `retire`", "the meta store has no such sink"): no_sink,
        ("`recover`, `abandon`, `retire`", "the sink's owner runs"): owner_runs,
        ("`recover`", "an epoch could still not be finished"): not_finished,
        ("`recover --drop-lost-open-files`", "without `--reason`"): drop_without_consent,
        ("`abandon`", "the epoch is COMMITTED or unknown"): abandon_not_pending,
        ("`abandon`", "without `--accept-data-loss`"): abandon_without_consent,
        ("`retire`", "the sink has a PENDING epoch"): retire_pending,
        ("`new-sink`", "a malformed name"): new_sink_refused,
        ("`demo`", "its independent reader"): lambda: [_demo_failure_status()],
    }
    text = (ROOT / "docs" / "cli.md").read_text()
    [(_, _, rows)] = [
        t for t in _tables(text) if [h.lower() for h in t[1]] == ["command", "when", "status"]
    ]
    assert len(rows) == len(scenarios), "rows and scenarios differ in number"
    wrong = []
    for command, when, status in rows:
        [key] = [k for k in scenarios if k[0] == command and when.startswith(k[1])] or [None]
        assert key is not None, f"docs/cli.md exit status row with no check: {command} | {when}"
        capsys.readouterr()
        codes = scenarios[key]()
        if set(codes) != {int(status)}:
            wrong.append(f"{command} | {when}: the docs say {status}, the code gives {codes}")
    assert not wrong, "docs/cli.md's exit statuses differ from the code:\n" + "\n".join(wrong)


_STAR = None
"""A stretch of text a pattern leaves open: a value the code formats in (``{name}``, ``%s``),
or an elision of the docs (``...``)."""

_FORMAT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrfgxi]|\{[^{}]*\}")


def _string_pieces(node: ast.AST, consts: dict[str, str] | None = None) -> list[str | None] | None:
    """A string expression of the code as literal pieces and ``_STAR``s (an f-string's
    values, ``%s``/``{}`` fields, operands of ``+`` that are not strings), or None. An
    f-string's value that is one of ``consts`` (the modules' upper-case string constants,
    such as ``DROP_LOST_HINT``) is that constant's text."""
    consts = consts or {}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        out: list[str | None] = []
        pos = 0
        for m in _FORMAT_FIELD.finditer(node.value):
            out += [node.value[pos : m.start()], _STAR]
            pos = m.end()
        return [*out, node.value[pos:]]
    if isinstance(node, ast.JoinedStr):
        return [_f_piece(v, consts) for v in node.values]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string_pieces(node.left, consts), _string_pieces(node.right, consts)
        if left is None and right is None:
            return None
        return (left if left is not None else [_STAR]) + (right if right is not None else [_STAR])
    return None


def _f_piece(value: ast.expr, consts: dict[str, str]) -> str | None:
    """One piece of an f-string: its literal text, a named constant's text, or ``_STAR``."""
    if isinstance(value, ast.Constant):
        return str(value.value)
    if (
        isinstance(value, ast.FormattedValue)
        and isinstance(value.value, ast.Name)
        and value.conversion == -1
        and value.format_spec is None
        and value.value.id in consts
    ):
        return consts[value.value.id]
    return _STAR


def _string_constants(trees: list[ast.Module]) -> dict[str, str]:
    """The modules' upper-case string constants (``NAME = "..."`` at module level)."""
    out: dict[str, str] = {}
    for tree in trees:
        for stmt in tree.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id.isupper()
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                out[stmt.targets[0].id] = stmt.value.value
    return out


def _pattern(pieces: list[str | None]) -> list[str | None]:
    """Characters (whitespace runs as one space) and ``_STAR``s."""
    out: list[str | None] = []
    for piece in pieces:
        if piece is _STAR:
            if not out or out[-1] is not _STAR:
                out.append(_STAR)
            continue
        for ch in re.sub(r"\s+", " ", piece):
            if not (ch == " " and out and out[-1] == " "):
                out.append(ch)
    return out


def _code_messages() -> list[tuple[str, list[str | None]]]:
    """Every string expression of eosink/ and plugins/ (implicit concatenation joined by the
    parser, ``+`` chains joined here) as a pattern, with its file."""
    out = []
    paths = sorted([*ROOT.glob("eosink/**/*.py"), *ROOT.glob("plugins/**/*.py")])
    trees = [ast.parse(path.read_text()) for path in paths]
    consts = _string_constants(trees)
    for path, tree in zip(paths, trees, strict=True):
        inner: set[int] = set()
        for node in ast.walk(tree):
            if id(node) in inner:
                continue
            pieces = _string_pieces(node, consts)
            if pieces is None:
                continue
            inner.update(id(n) for n in ast.walk(node))
            pattern = _pattern(pieces)
            if sum(1 for c in pattern if c is not _STAR) >= 15:
                out.append((str(path.relative_to(ROOT)), pattern))
    return out


def _doc_pattern(quote: str) -> list[str | None]:
    """A quoted message of the docs, open at both ends (an excerpt), ``...`` an elision."""
    text = re.sub(r"\s*(\.\.\.|…)\s*", "...", re.sub(r"\s+", " ", quote.strip()))
    out: list[str | None] = [_STAR]
    for part in re.split(r"(\.\.\.)", text):
        if part == "...":
            if out[-1] is not _STAR:
                out.append(_STAR)
        else:
            out.extend(part)
    return out if out[-1] is _STAR else [*out, _STAR]


def _instance_of_both(code: list[str | None], doc: list[str | None]) -> bool:
    """Whether one text fits both patterns: the code's literal characters, with each of its
    values standing for one word of the docs (no space: an example value such as
    ``'s3a://bucket/chk'`` or ``100``), and the docs' elisions standing for anything. A
    bit-parallel walk over the code's pattern: bit j set = the docs' first j tokens matched."""
    n = len(doc)
    star = word = 0
    eq: dict[str, int] = {}
    for j, c in enumerate(doc):
        if c is _STAR:
            star |= 1 << j
        else:
            eq[c] = eq.get(c, 0) | (1 << j)
        if c is _STAR or c != " ":
            word |= 1 << j
    full = (1 << (n + 1)) - 1

    def elide(r: int) -> int:  # an elision of the docs may stand for nothing
        while (nxt := r | ((r & star) << 1)) != r:
            r = nxt
        return r

    reach = elide(1)
    for c in code:
        if c is _STAR:  # a value of the code: one word of the docs, or nothing
            while (nxt := reach | ((reach & word) << 1)) != reach:
                reach = nxt
            reach = elide(reach & full)
        else:  # a character: the same character of the docs, or inside an elision
            reach = elide((((reach & eq.get(c, 0)) << 1) | (reach & star)) & full)
        if not reach:
            return False
    return bool(reach >> n & 1)


_SAMPLES_RUN_ELSEWHERE = {"run.md"}
"""Pages whose code blocks' error lines are produced by running the code in another test
(``test_run_md_error_samples_are_what_the_code_says``): composed messages, no one string."""


def _quoted_errors() -> list[tuple[str, str]]:
    """The error texts the docs quote, as (where, message): backticked text holding
    ``<EosinkError class>: message`` (`` `ConfigError: checkpoint location ...` ``), code block
    lines starting so (``eosink.errors.ConfigError: ...``), and a double-quoted text that a
    sentence attributes to an eosink error (a `` `SinkError` `` "cannot reach Kafka at ...")."""
    from eosink import errors

    names = "|".join(sorted(errors.__all__, key=len, reverse=True))
    cls = rf"(?:eosink\.errors\.)?\b(?:{names})\b: "
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        prose, code = _md_blocks(path.read_text())
        name = path.relative_to(ROOT)
        for m in re.finditer(r"`([^`]+)`", prose):
            hit = re.search(cls, m.group(1))
            if hit:
                line = prose.count("\n", 0, m.start()) + 1
                found.append((f"{name}:{line}", m.group(1)[hit.end() :]))
        for n, line_text in code:
            hit = re.match(rf"\s*{cls}", line_text)
            if hit and path.name not in _SAMPLES_RUN_ELSEWHERE:
                found.append((f"{name}:{n}", line_text[hit.end() :]))
        # double quotes outside code spans (a quote may hold code spans)
        masked = re.sub(r"`[^`]*`", lambda s: "`" + "x" * (len(s.group(0)) - 2) + "`", prose)
        for m in re.finditer(r'"([^"]+)"', masked):
            before = masked[max(0, m.start() - 200) : m.start()]
            sentence = re.split(r"[.;]\s|\n\s*\n", before)[-1]
            quote = prose[m.start(1) : m.end(1)]
            if len(quote.split()) >= 3 and re.search(
                rf"`(?:{names})`", prose[m.start() - len(sentence) : m.start()]
            ):
                line = prose.count("\n", 0, m.start()) + 1
                found.append((f"{name}:{line}", quote))
    return found


def _in_the_code(quote: str, messages: list[tuple[str, list[str | None]]]) -> bool:
    doc = _doc_pattern(quote)
    words = set(re.findall(r"[A-Za-z]{3,}", quote))
    # the messages sharing the most words first: the walk is then run on a few
    ranked = sorted(
        messages,
        key=lambda m: (
            -len(words & set(re.findall(r"[A-Za-z]{3,}", "".join(c or " " for c in m[1]))))
        ),
    )
    return any(_instance_of_both(pattern, doc) for _, pattern in ranked[:40])


def test_errors_md_has_an_entry_for_every_error_class() -> None:
    """docs/errors.md has exactly one section per class of ``eosink.errors``, each saying (in
    bold) what was written; every ``eosink`` command it gives parses with the real command
    line; the page is in the docs' navigation."""
    import shlex

    from eosink import errors
    from eosink._cli import build_parser

    text = (ROOT / "docs" / "errors.md").read_text()
    sections = dict(
        (m.group(1), m.group(2))
        for m in re.finditer(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    )
    assert sorted(sections) == sorted(errors.__all__)
    for name, body in sections.items():
        if name != "EosinkError":
            said = re.search(
                r"\*\*(nothing|the change|stopped|before|at the commit|committed|the epoch may)",
                body,
                re.I,
            )
            assert said, f"errors.md, {name}: does not say what was written"
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    commands = re.findall(r"^(eosink (?:\S.*?))(?:\s+#.*)?$", blocks, re.M)
    assert len(commands) >= 8, commands
    parser = build_parser()
    for command in commands:
        parser.parse_args(shlex.split(command)[1:])  # SystemExit on an unknown option
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "errors.md" in nav


def test_every_error_message_ends_with_its_errors_md_entry() -> None:
    """Every eosink error's message ends with ``(see docs/errors.md#<anchor>)``, the anchor
    of its class's section there (mkdocs: the heading lowercased); a plugin's own subclass
    points to its base's; the pointer is not repeated when the message crossed Spark and
    was rebuilt with it."""
    from eosink import errors

    text = (ROOT / "docs" / "errors.md").read_text()
    anchors = {h.lower() for h in re.findall(r"^## (\w+)$", text, re.M)}
    for name in errors.__all__:
        cls = getattr(errors, name)
        err = cls.__new__(cls)
        Exception.__init__(err, "the message")
        said = str(err)
        m = re.fullmatch(r"the message \(see docs/errors\.md#(\w+)\)", said)
        assert m and m.group(1) == name.lower() and m.group(1) in anchors, said
        assert str(errors._rebuild(cls, (said,), {})) == said

    class PluginsOwn(errors.CommitFailedError):
        pass

    assert str(PluginsOwn("x")) == "x (see docs/errors.md#commitfailederror)"


def test_error_texts_quoted_in_the_docs_are_in_the_code() -> None:
    """Every error message the docs quote is one the code can give: its fixed part is in a
    string of eosink/ or plugins/, the code's values ({...}, %s) standing for the docs'
    example values and the docs' ``...`` for what they leave out."""
    messages = _code_messages()
    quotes = _quoted_errors()
    assert len(quotes) >= 10, quotes  # the extraction finds the docs' quotes
    # The matcher can say no: a quote with a changed word is not in the code.
    assert _in_the_code("it was aborted outside eosink ... Its rows are lost from S3", messages)
    assert not _in_the_code("it was aborted outside eosink ... Its rows must be resent", messages)
    missing = [f"{where}: {q}" for where, q in quotes if not _in_the_code(q, messages)]
    assert not missing, "error texts the docs quote that the code does not give:\n" + "\n".join(
        missing
    )


def test_iceberg_md_says_which_pyiceberg_is_tested() -> None:
    """docs/iceberg.md names the pyiceberg the suite runs (the lock file's), the range the
    ``iceberg`` extra allows and the range the sink runs without a warning, as they are."""
    from eosink_iceberg import _compat

    # uv.lock and pyproject.toml read as text: tomllib needs Python 3.11, eosink runs on 3.10
    lock = (ROOT / "uv.lock").read_text()
    locked = re.search(r'\[\[package\]\]\nname = "pyiceberg"\nversion = "([^"]+)"', lock)
    assert locked, "uv.lock has no pyiceberg"
    extras = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r'^iceberg = \[.*?"(pyiceberg\[[^"]+)"', extras, re.M)
    assert extra, "pyproject.toml's iceberg extra has no pyiceberg"
    text = " ".join((ROOT / "docs" / "iceberg.md").read_text().split())
    assert f"pyiceberg {locked.group(1)}" in text, f"docs/iceberg.md: pyiceberg {locked.group(1)}"
    assert f"`{extra.group(1)}`" in text, f"docs/iceberg.md does not give {extra.group(1)}"
    assert f"`{_compat.PYICEBERG_TESTED}`" in text


def test_diagrams_are_rendered_from_their_sources() -> None:
    """Every Mermaid source of docs/diagrams/ has its SVG in docs/img/, rendered from the
    source as it is now (the SVG's first line holds the source's SHA-256), and the docs show
    it: a changed diagram is rendered again (``python docs/_ext/diagrams.py``) or this fails."""
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import diagrams
    finally:
        sys.path.pop(0)
    sources = sorted((ROOT / "docs" / "diagrams").glob("*.mmd"))
    assert {s.stem for s in sources} >= {"protocol", "states"}
    shown = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for src in sources:
        svg = ROOT / "docs" / "img" / f"{src.stem}.svg"
        assert svg.exists(), f"{svg} is missing: run python docs/_ext/diagrams.py"
        first, _, rest = svg.read_text().partition("\n")
        assert first == diagrams.header(src), (
            f"{svg.name} was rendered from another {src.name}: run python docs/_ext/diagrams.py"
        )
        assert rest.startswith("<svg") and "foreignObject" not in rest  # text an <img> shows
        assert f"(img/{svg.name})" in shown, f"no page shows {svg.name}"

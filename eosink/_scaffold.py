"""``eosink new-sink NAME``: write a ready third-party sink plugin package.

The package is a working exactly-once sink (rows into a table of a SQLite database file,
standard library only beyond eosink) with its conformance and SIGKILL crash tests, so a
plugin author starts from something green and changes it step by step. The templates are
package data under ``eosink/_templates/sink/`` (``*.tmpl``); the only substitutions are the
names derived from NAME, which is checked first, so nothing else can end up in the code.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:  # importlib.resources.abc is new in Python 3.11
    from importlib.resources.abc import Traversable

__all__ = ["SinkNames", "new_sink", "next_steps", "sink_names"]

_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_MAX_NAME = 40
_TEMPLATES = ("_templates", "sink")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class SinkNames:
    """The names a sink package is built from.

    Attributes:
        sink: the sink's name, as users pass ``sink=`` and as the entry point is named.
        module: the import package, ``eosink_<sink>``.
        dist: the distribution on PyPI, ``eosink-<sink>`` (underscores become dashes).
        directory: the directory written, ``eosink-<sink>``.
    """

    sink: str
    module: str
    dist: str
    directory: str


def sink_names(name: str) -> SinkNames:
    """Check ``name`` and derive the package's names from it.

    Raises:
        ConfigError: ``name`` is not lowercase letters and digits in words joined by single
            underscores, starting with a letter, at most 40 characters.
    """
    if not _NAME.fullmatch(name) or len(name) > _MAX_NAME:
        raise ConfigError(
            f"invalid sink name {name!r}: use lowercase letters and digits, words joined by "
            f"single underscores, starting with a letter, at most {_MAX_NAME} characters "
            "(e.g. 'sqlite_events'); it becomes the sink= name, the module eosink_<name> "
            "and the package eosink-<name>"
        )
    return SinkNames(
        sink=name,
        module=f"eosink_{name}",
        dist=f"eosink-{name.replace('_', '-')}",
        directory=f"eosink-{name}",
    )


def _check_free(names: SinkNames) -> None:
    """Refuse a name that an installed sink or module already has: both would clash."""
    if importlib.util.find_spec(names.module) is not None:
        raise ConfigError(
            f"a module named {names.module} is already installed; pick another sink name"
        )
    from .registry import list_sinks

    try:
        installed = {s.name: s.package for s in list_sinks()}
    except Exception:  # a broken third-party plugin must not stop the scaffolding
        return
    if names.sink in installed:
        raise ConfigError(
            f"a sink named {names.sink!r} is already installed (package "
            f"{installed[names.sink]}); pick another name: two sinks of one name cannot load"
        )


def _templates() -> Traversable:
    root = resources.files("eosink")
    for part in _TEMPLATES:
        root = root / part
    return root


def _walk(node: Traversable, prefix: str = "") -> list[tuple[str, Traversable]]:
    out: list[tuple[str, Traversable]] = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        rel = f"{prefix}{child.name}"
        if child.is_dir():
            out += _walk(child, rel + "/")
        elif child.name.endswith(".tmpl"):
            out.append((rel.removesuffix(".tmpl"), child))
    return out


def render(names: SinkNames) -> dict[str, str]:
    """The package's files (relative path -> text), without writing anything."""
    from . import __version__

    values = {
        "name": names.sink,
        "module": names.module,
        "dist": names.dist,
        "directory": names.directory,
        "eosink_version": __version__,
    }
    files: dict[str, str] = {}
    for rel, template in _walk(_templates()):
        rel = rel.replace("PACKAGE/", f"{names.module}/")
        if rel == "gitignore":  # a dotfile in package data is easily dropped by builds
            rel = ".gitignore"
        files[rel] = _PLACEHOLDER.sub(lambda m: values[m.group(1)], template.read_text())
    return files


def new_sink(name: str, parent: str | os.PathLike[str] = ".") -> Path:
    """Write the package ``eosink-<name>/`` under ``parent``; return its directory.

    The files are written into a hidden sibling directory first and renamed into place, so
    the target is either absent, or complete.

    Raises:
        ConfigError: an invalid or already installed name, or a target that exists and is
            not an empty directory (nothing is written then).
    """
    names = sink_names(name)
    target = Path(parent).expanduser().resolve() / names.directory
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(
            f"{target} already exists and is not an empty directory; remove it or choose "
            "another --dir"
        )
    _check_free(names)
    files = render(names)
    tmp = target.with_name(f".{names.directory}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        os.replace(tmp, target)  # onto an empty directory too
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"cannot write {target}: {exc}") from None
    return target


def next_steps(target: Path) -> str:
    """What ``eosink new-sink`` prints after writing ``target``."""
    files = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    listing = "\n".join(f"  {f}" for f in files)
    return (
        f"created {target}:\n{listing}\n\n"
        "next:\n"
        f"  cd {target}\n"
        "  pip install -e '.[test]'    # or: uv pip install -e '.[test]'\n"
        "  pytest                      # conformance and SIGKILL crash tests (Java 17+)\n"
        "then edit the package's plugin.py: README.md says where to start"
    )

"""Griffe extension for the API reference: eosink's docstrings in Markdown.

eosink's docstrings are Google style with Sphinx cross-reference roles
(``:class:`~eosink.errors.ConfigError```, ``:meth:`writer_setup```) and the odd ``::``
introducing a literal block: readable with ``help()``, but Markdown would show them as they
are. This turns each role into an autorefs link (``[`ConfigError`][eosink.errors.ConfigError]``)
to the object's canonical path, resolved like Python names from where the docstring is
(the object, its class, its module), then as a name exported by ``eosink`` (an attribute
without a docstring of its own is described by its class: the link goes there); and ``::`` at
the end of a line into ``:``. A role that resolves to nothing still becomes a link, so that
``mkdocs build --strict`` fails on it when the docstring is rendered (autorefs warns about
every link it cannot find), and is silent about docstrings the reference does not show.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|data|exc|mod|obj):`(~?)([\w.]+?)(\(\))?`")
_LITERAL_INTRO = re.compile(r"(?<=\S)::\s*$")
_PACKAGE = "eosink"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles and ``::`` in every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **_: Any) -> None:
        """Rewrite the docstrings of every object of ``pkg``."""
        if pkg.path != _PACKAGE:
            return
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj, obj.docstring.value, loader)


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_objects(member))  # type: ignore[arg-type]
    return found


def _rewrite(obj: griffe.Object, text: str, loader: griffe.GriffeLoader) -> str:
    """``text`` with roles as links (as plain names inside literal blocks and code fences)."""

    def shown(m: re.Match[str]) -> str:
        _role, short, target, call = m.groups()
        return (target.rsplit(".", 1)[-1] if short else target) + (call or "")

    def link(m: re.Match[str]) -> str:
        return f"[`{shown(m)}`][{_resolve(obj, m.group(3), loader)}]"

    lines = []
    literal: int | None = None  # the indentation of the line that introduced a literal block
    fenced = False
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip())
        if literal is not None and line.strip() and indent <= literal:
            literal = None
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or literal is not None or line.lstrip().startswith("```"):
            lines.append(_ROLE.sub(shown, line))
            continue
        line = _ROLE.sub(link, line)
        if _LITERAL_INTRO.search(line):
            line, literal = _LITERAL_INTRO.sub(":", line), indent
        lines.append(line)
    return "\n".join(lines)


def _resolve(obj: griffe.Object, target: str, loader: griffe.GriffeLoader) -> str:
    """The canonical path of ``target`` seen from ``obj``, or ``target`` when none is found."""
    first, _, rest = target.partition(".")
    candidates = [target] if first == _PACKAGE else []
    if not candidates:
        try:  # the object's members, then its parents' (class, module) and their imports
            candidates.append(obj.resolve(first) + (f".{rest}" if rest else ""))
        except griffe.NameResolutionError:
            pass
    candidates.append(f"{_PACKAGE}.{target}")
    for path in candidates:
        try:
            found = loader.modules_collection[path]
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        try:
            if found.is_attribute and not found.docstring and found.parent is not None:
                found = found.parent  # described in its class's Attributes section
            return str(found.canonical_path)
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
    return target

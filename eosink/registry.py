"""Plugin discovery: one pluggy manager, the ``eosink`` entry-point group."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import pluggy

from . import hookspecs
from .errors import ConfigError, UnknownSinkError
from .sink import SinkPlugin

log = logging.getLogger("eosink.registry")

ENTRY_POINT_GROUP = "eosink"
"""The entry-point group plugin packages register their hook module in."""

__all__ = ["ENTRY_POINT_GROUP", "SinkInfo", "get_sink", "list_sinks", "plugin_manager"]


@dataclass(frozen=True)
class SinkInfo:
    """One installed sink, as ``eosink plugins`` lists it.

    Attributes:
        name: the sink's name (what ``sink=`` takes).
        package: the distribution that registers it (``eosink`` for the built-in sinks).
        version: that distribution's version.
        description: the sink's one-line description.
        missing: the modules the sink declares (``SinkPlugin.requires``) that are not
            installed; empty when the sink is ready.
        install: the command that installs them (``pip install 'eosink[iceberg]'``), or "".
    """

    name: str
    package: str
    version: str
    description: str
    missing: tuple[str, ...] = ()
    install: str = ""

    @property
    def status(self) -> str:
        """``ready``, or ``missing extra`` (see :attr:`install`)."""
        return "missing extra" if self.missing else "ready"


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every entry-point plugin loaded."""
    pm = pluggy.PluginManager("eosink")
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


def _sinks() -> dict[str, tuple[SinkPlugin[Any, Any, Any], str, str]]:
    pm = plugin_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    found: dict[str, tuple[SinkPlugin[Any, Any, Any], str, str]] = {}
    for impl in pm.hook.eosink_sinks.get_hookimpls():
        dist = dists.get(id(impl.plugin))
        package = dist.project_name if dist else impl.plugin_name
        version = dist.version if dist else ""
        provided: list[SinkPlugin[Any, Any, Any]] = impl.function() or []  # type: ignore[assignment]
        for sink in provided:
            if sink.name in found:
                other = found[sink.name][1]
                raise ConfigError(
                    f"sink {sink.name!r} is provided by both {other} and {package}; "
                    "uninstall one of them"
                )
            found[sink.name] = (sink, package, version)
    return found


def list_sinks() -> list[SinkInfo]:
    """Every installed sink with the package and version that provide it, and its status."""
    out = []
    for name, (sink, pkg, ver) in sorted(_sinks().items()):
        missing = sink.missing_requirements()
        targets = " ".join(f"'{t}'" for t in dict.fromkeys(missing.values()))
        install = f"pip install {targets}" if missing else ""
        out.append(SinkInfo(name, pkg, ver, sink.description, tuple(missing), install))
    return out


def get_sink(name: str) -> SinkPlugin[Any, Any, Any]:
    """The sink registered as ``name``.

    Raises:
        UnknownSinkError: listing the installed sinks.
    """
    sinks = _sinks()
    if name not in sinks:
        raise UnknownSinkError(name, list(sinks))
    return sinks[name][0]

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

__all__ = [
    "ENTRY_POINT_GROUP",
    "BrokenPlugin",
    "SinkInfo",
    "broken_plugins",
    "get_sink",
    "list_sinks",
    "plugin_manager",
]


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
    error: str = ""
    """A plugin that failed to load: the exception (then ``name`` is its entry point's)."""

    @property
    def status(self) -> str:
        """``ready``, ``missing extra`` (see :attr:`install`) or ``broken`` (see :attr:`error`)."""
        if self.error:
            return "broken"
        return "missing extra" if self.missing else "ready"


@dataclass(frozen=True)
class BrokenPlugin:
    """An installed plugin that failed to load: its sinks are unavailable, the others work.

    Attributes:
        entry_point: the entry point's name in the ``eosink`` group.
        package: the distribution that registers it.
        version: that distribution's version.
        error: the exception, as ``Type: message``.
    """

    entry_point: str
    package: str
    version: str
    error: str


_broken: list[BrokenPlugin] = []
_dists: dict[int, tuple[str, str]] = {}  # id(plugin module) -> (package, version)


def _describe(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every entry-point plugin that loads.

    Entry points are loaded one by one: a plugin whose module fails to import is reported
    once (a warning naming it and its package), listed as broken by ``eosink plugins``, and
    never stops the other sinks (``broken_plugins()`` lists it).
    """
    from importlib import metadata

    pm = pluggy.PluginManager("eosink")
    pm.add_hookspecs(hookspecs)
    for dist in metadata.distributions():
        package = dist.metadata["name"] or "?"
        for ep in dist.entry_points:
            if ep.group != ENTRY_POINT_GROUP or pm.get_plugin(ep.name) or pm.is_blocked(ep.name):
                continue
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
            except Exception as exc:
                _report(BrokenPlugin(ep.name, package, dist.version, _describe(exc)))
                continue
            _dists[id(plugin)] = (package, dist.version)
    return pm


def _report(broken: BrokenPlugin) -> None:
    if broken in _broken:
        return
    _broken.append(broken)
    log.warning(
        "eosink plugin %r of package %s %s failed to load (%s); its sinks are unavailable, "
        "the other sinks work. Fix or uninstall the package: pip uninstall %s",
        broken.entry_point,
        broken.package,
        broken.version,
        broken.error,
        broken.package,
    )


def broken_plugins() -> list[BrokenPlugin]:
    """The installed plugins that failed to load (their entry point, or their
    ``eosink_sinks`` hook, raised)."""
    _sinks()
    return list(_broken)


def _sinks() -> dict[str, tuple[SinkPlugin[Any, Any, Any], str, str]]:
    pm = plugin_manager()
    found: dict[str, tuple[SinkPlugin[Any, Any, Any], str, str]] = {}
    for impl in pm.hook.eosink_sinks.get_hookimpls():
        package, version = _dists.get(id(impl.plugin), (impl.plugin_name, ""))
        try:
            provided: list[SinkPlugin[Any, Any, Any]] = impl.function() or []  # type: ignore[assignment]
        except Exception as exc:
            _report(BrokenPlugin(impl.plugin_name, package, version, _describe(exc)))
            continue
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
    """Every installed sink with the package and version that provide it, and its status;
    then the plugins that failed to load (status ``broken``)."""
    out = []
    for name, (sink, pkg, ver) in sorted(_sinks().items()):
        missing = sink.missing_requirements()
        targets = " ".join(f"'{t}'" for t in dict.fromkeys(missing.values()))
        install = f"pip install {targets}" if missing else ""
        out.append(SinkInfo(name, pkg, ver, sink.description, tuple(missing), install))
    for b in _broken:
        out.append(SinkInfo(b.entry_point, b.package, b.version, "", error=b.error))
    return out


def get_sink(name: str) -> SinkPlugin[Any, Any, Any]:
    """The sink registered as ``name``.

    Raises:
        UnknownSinkError: listing the installed sinks.
    """
    sinks = _sinks()
    if name not in sinks:
        failed = [f"{b.entry_point} of {b.package} {b.version} ({b.error})" for b in _broken]
        raise UnknownSinkError(name, list(sinks), failed)
    return sinks[name][0]

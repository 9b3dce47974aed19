"""The versioned codecs of write results and committables (part of the plugin contract;
public as ``eosink.Codec`` and ``eosink.JsonCodec``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Codec(Protocol[T]):
    """Serializes a write result or a committable to bytes, with a version.

    Contract:
        * Versioning: ``version`` is stored beside every encoded value. ``decode`` must accept
            every version it ever wrote, so that a committable persisted by an older eosink
            can still be committed after an upgrade.
    """

    @property
    def version(self) -> int:
        """The version ``encode`` writes (stored beside every encoded value)."""
        ...

    def encode(self, value: T) -> bytes:
        """Return the bytes of ``value``."""
        ...

    def decode(self, data: bytes, version: int) -> T:
        """Rebuild a value from bytes written by ``encode`` at ``version``."""
        ...


@dataclass(frozen=True)
class JsonCodec(Generic[T]):
    """A codec for JSON-serializable values (dicts, lists, strings, numbers).

    Give it the type it encodes, so that mypy checks the plugin against it::

        committable_codec=JsonCodec[dict[str, Any]](version=1)

    (``JsonCodec(version=1)`` alone is a ``JsonCodec[Never]`` for a strict type checker.)
    """

    version: int = 1

    def encode(self, value: T) -> bytes:
        """Compact JSON with sorted keys (the same value always gives the same bytes)."""
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()

    def decode(self, data: bytes, version: int) -> T:
        """Parse JSON written at any version up to :attr:`version`.

        Raises:
            ValueError: ``version`` is newer than this codec (written by a newer release).
        """
        if version > self.version:
            raise ValueError(
                f"cannot decode version {version}: this codec reads up to {self.version}"
            )
        return json.loads(data)  # type: ignore[no-any-return]

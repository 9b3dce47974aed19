"""Partition transforms: the ``partition_by`` grammar, parsed once into :class:`PartitionTerm`.

``partition_by`` entries are ``col``, ``identity(col)``, ``year(col)``, ``month(col)``,
``day(col)``, ``hour(col)``, ``bucket(N, col)`` and ``truncate(W, col)``. The options model
parses them into terms when it validates (``IcebergSinkOptions.partition_by`` holds terms); the
table's own spec is read into terms too (:func:`table_terms`), so everything downstream (table
creation, the spec check, the native path) compares and dispatches on typed objects.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "TIME_TRANSFORMS",
    "PartitionTerm",
    "applicable_transforms",
    "check_transforms_writable",
    "parse_partition_by",
    "source_type_error",
    "table_terms",
]

TransformName = Literal["identity", "year", "month", "day", "hour", "bucket", "truncate", "void"]
TIME_TRANSFORMS = ("year", "month", "day", "hour")
_NAMES = ("identity", *TIME_TRANSFORMS, "bucket", "truncate")
_CALL = re.compile(r"^\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?([\w.]+)\s*\)\s*$")
_COLUMN = re.compile(r"^[\w.]+$")


@dataclass(frozen=True)
class PartitionTerm:
    """One partition field: a transform of a source column.

    Attributes:
        transform: ``identity``, ``year``, ``month``, ``day``, ``hour``, ``bucket``,
            ``truncate`` (or ``void``, only in a table's evolved spec).
        source: the source column (``a.b`` for a nested field).
        width: the number of buckets of ``bucket``, the width of ``truncate``, else None.
    """

    transform: TransformName
    source: str
    width: int | None = None

    def __str__(self) -> str:
        """The ``partition_by`` spelling: ``grp``, ``day(ts)``, ``bucket(16, id)``."""
        if self.transform == "identity":
            return self.source
        if self.width is not None:
            return f"{self.transform}({self.width}, {self.source})"
        return f"{self.transform}({self.source})"

    @classmethod
    def parse(cls, text: str) -> PartitionTerm:
        """Parse one ``partition_by`` entry.

        Raises:
            ValueError: not an entry of the grammar (the message quotes it).
        """
        m = _CALL.match(text)
        if m is None:
            if not _COLUMN.fullmatch(text.strip()):
                raise ValueError(f"invalid partition field {text!r}")
            return cls("identity", text.strip())
        name, arg, col = m.group(1).lower(), m.group(2), m.group(3)
        if name not in _NAMES:
            raise ValueError(f"unknown partition transform {name!r} in {text!r}")
        if (name in ("bucket", "truncate")) != (arg is not None):
            raise ValueError(f"{text!r}: bucket and truncate take a width, e.g. bucket(16, id)")
        width = int(arg) if arg is not None else None
        if width is not None and width < 1:
            raise ValueError(f"{text!r}: the width must be at least 1")
        return cls(name, col, width)  # type: ignore[arg-type]

    @property
    def field_name(self) -> str:
        """The partition field's name in a table eosink creates: ``grp``, ``ts_day``,
        ``id_bucket``, ``name_trunc``."""
        if self.transform == "identity":
            return self.source
        if self.transform == "truncate":
            return f"{self.source}_trunc"
        return f"{self.source}_{self.transform}"

    def iceberg(self) -> Any:
        """The pyiceberg transform object."""
        from pyiceberg.transforms import (
            BucketTransform,
            DayTransform,
            HourTransform,
            IdentityTransform,
            MonthTransform,
            TruncateTransform,
            VoidTransform,
            YearTransform,
        )

        if self.transform == "bucket":
            return BucketTransform(self.width or 0)
        if self.transform == "truncate":
            return TruncateTransform(self.width or 0)
        simple = {
            "identity": IdentityTransform,
            "year": YearTransform,
            "month": MonthTransform,
            "day": DayTransform,
            "hour": HourTransform,
            "void": VoidTransform,
        }
        return simple[self.transform]()

    @classmethod
    def from_iceberg(cls, source: str, transform: Any) -> PartitionTerm:
        """The term of a table's partition field (``source``: its source column's name).

        Raises:
            ValueError: a transform eosink does not know (a newer Iceberg's).
        """
        from pyiceberg.transforms import BucketTransform, TruncateTransform

        if isinstance(transform, BucketTransform):
            return cls("bucket", source, transform.num_buckets)
        if isinstance(transform, TruncateTransform):
            return cls("truncate", source, transform.width)
        name = str(transform)
        if name not in (*_NAMES, "void"):
            raise ValueError(f"unknown partition transform {name!r} of column {source!r}")
        return cls(name, source)  # type: ignore[arg-type]


# Which source types each transform applies to (the Iceberg spec, "Partition Transforms"),
# by the Iceberg type's kind (its name without parameters: "decimal(10, 2)" -> "decimal").
_TIMESTAMPS = ("timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns")
_SOURCE_KINDS: dict[str, tuple[str, ...]] = {
    "bucket": (
        "int",
        "long",
        "decimal",
        "date",
        "time",
        *_TIMESTAMPS,
        "string",
        "uuid",
        "fixed",
        "binary",
    ),
    "truncate": ("int", "long", "decimal", "string", "binary"),
    "year": ("date", *_TIMESTAMPS),
    "month": ("date", *_TIMESTAMPS),
    "day": ("date", *_TIMESTAMPS),
    "hour": _TIMESTAMPS,
}
_ALLOWED_TEXT = {
    "identity": "any primitive column (not a struct, list or map)",
    "bucket": "int, long, decimal, date, time, timestamp, timestamptz, string, uuid, fixed "
    "and binary columns",
    "truncate": "int, long, decimal, string and binary columns",
    "year": "date, timestamp and timestamptz columns",
    "month": "date, timestamp and timestamptz columns",
    "day": "date, timestamp and timestamptz columns",
    "hour": "timestamp and timestamptz columns",
}


def _kind(source_type: Any) -> str:
    """The kind of an Iceberg type: ``decimal(10, 2)`` -> ``decimal``, ``fixed[16]`` ->
    ``fixed``, a struct, list or map -> ``struct``, ``list``, ``map``."""
    if not getattr(source_type, "is_primitive", True):
        return type(source_type).__name__.removesuffix("Type").lower()
    return re.split(r"[(\[]", str(source_type), maxsplit=1)[0].strip().lower()


def _applies(transform: str, kind: str, primitive: bool) -> bool:
    if transform == "void":
        return True
    if transform == "identity":
        return primitive
    return kind in _SOURCE_KINDS.get(transform, ())


def applicable_transforms(source_type: Any, source: str) -> list[str]:
    """The ``partition_by`` spellings that apply to a column of ``source_type`` (an Iceberg
    type), e.g. ``['s', 'bucket(N, s)', 'truncate(W, s)']`` for a string column ``s``."""
    kind, primitive = _kind(source_type), bool(getattr(source_type, "is_primitive", True))
    out = []
    for name in ("identity", *TIME_TRANSFORMS, "bucket", "truncate"):
        if _applies(name, kind, primitive):
            width = {"bucket": "N", "truncate": "W"}.get(name)
            out.append(
                source
                if name == "identity"
                else f"{name}({width}, {source})"
                if width
                else f"{name}({source})"
            )
    return out


def source_type_error(term: PartitionTerm, source_type: Any) -> str | None:
    """Why ``term`` cannot partition a column of ``source_type`` (an Iceberg type), as the
    Iceberg spec defines each transform's source types; None when it can."""
    kind, primitive = _kind(source_type), bool(getattr(source_type, "is_primitive", True))
    if _applies(term.transform, kind, primitive):
        return None
    fits = applicable_transforms(source_type, term.source)
    return (
        f"column {term.source!r} is {source_type}, and the {term.transform} transform applies "
        f"to {_ALLOWED_TEXT[term.transform]} only; "
        + (
            f"what can partition {term.source!r}: {', '.join(fits)}"
            if fits
            else f"no transform partitions a {kind} column (partition by one of its fields)"
        )
    )


def parse_partition_by(value: Any) -> tuple[PartitionTerm, ...]:
    """``partition_by`` as given (a string ``"a, day(ts)"`` or a list of entries or terms)
    parsed into terms.

    Raises:
        ValueError: an entry is not of the grammar.
    """
    if isinstance(value, str):
        value = [p for p in re.split(r",(?![^(]*\))", value) if p.strip()]
    if isinstance(value, PartitionTerm):
        value = [value]
    out: list[PartitionTerm] = []
    for p in value:
        if isinstance(p, PartitionTerm):
            out.append(p)
        elif isinstance(p, str):
            out.append(PartitionTerm.parse(p))
        else:
            raise ValueError(f"invalid partition field {p!r}")
    return tuple(out)


def table_terms(table: Any, *, with_void: bool = False) -> list[tuple[Any, PartitionTerm]]:
    """(partition field, term) of every field of ``table``'s current spec (a pyiceberg Table
    or TableMetadata). Void fields (a dropped field of an evolved spec) only if asked."""
    schema = table.schema()
    out = []
    for f in table.spec().fields:
        source = schema.find_column_name(f.source_id) or f"#{f.source_id}"
        term = PartitionTerm.from_iceberg(source, f.transform)
        if term.transform != "void" or with_void:
            out.append((f, term))
    return out


def check_transforms_writable(terms: Iterable[PartitionTerm], table_name: str) -> None:
    """pyiceberg computes every partition value but identity ones (bucket, truncate, year,
    month, day, hour) with the optional ``pyiceberg-core`` package: say so on the driver,
    before a table is created or a Spark task fails.

    Raises:
        ConfigError: a transform needs ``pyiceberg-core`` and it is not installed.
    """
    import importlib.util

    from eosink import ConfigError

    needs = sorted({str(t.iceberg()) for t in terms if t.transform not in ("identity", "void")})
    if needs and importlib.util.find_spec("pyiceberg_core") is None:
        raise ConfigError(
            f"Iceberg table {table_name!r}: writing partition transforms {', '.join(needs)} "
            "needs the Python package pyiceberg-core, which is not installed. Install it "
            "with: pip install 'pyiceberg[pyiceberg-core]' (or partition by plain columns)."
        )

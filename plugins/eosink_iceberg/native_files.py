"""What the native path wrote: every Parquet file Spark wrote under the epoch's directory as
a DataFile (pyiceberg's statistics from its footer), its partition record read from its
directory (Spark's ``%XX`` escaping undone; string values cross-checked against the footer's
min/max of the source column).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eosink import SinkError
from eosink.util import fsync_path

from . import _compat
from .datafiles import data_file_to_json
from .native_plan import Part
from .transforms import PartitionTerm

__all__ = ["partition_record", "staged_data_files"]

_NULL_DIR = "__HIVE_DEFAULT_PARTITION__"

_ESCAPED = re.compile(r"%([0-9A-Fa-f]{2})")


def staged_data_files(
    metadata: Any, path: str, parts: list[Part], io_properties: dict[str, str]
) -> list[dict[str, Any]]:
    """The JSON DataFiles of every Parquet file Spark wrote under ``path``."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    filesystem, root, scheme = _compat.location_filesystem(io_properties, path)
    root = root.rstrip("/")
    infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    found: list[tuple[str, int]] = []
    litter: list[str] = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(root) + 1 :]
        if any(p[:1] in "._" for p in rel.split("/")):
            litter.append(info.path)  # .crc checksums of the local filesystem
            continue
        found.append((rel, int(info.size or 0)))

    local = scheme == "file"

    def footer(rel: str) -> Any:
        if local:  # Spark's writers do not fsync: the files are durable before PENDING
            fsync_path(f"{root}/{rel}")
        with filesystem.open_input_file(f"{root}/{rel}") as fh:
            return pq.read_metadata(fh)

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(found)))) as pool:
        footers = list(pool.map(footer, [rel for rel, _ in found]))
        if local:  # the directory entries too, deepest first
            dirs = {root}
            for rel, _ in found:
                parts_of = rel.split("/")[:-1]
                dirs |= {"/".join([root, *parts_of[: i + 1]]) for i in range(len(parts_of))}
            for d in sorted(dirs, key=lambda x: -x.count("/")):
                fsync_path(d)
            fsync_path(root.rsplit("/", 1)[0])
    spec_id = metadata.default_spec_id
    out = []
    for (rel, size), meta in zip(found, footers, strict=True):
        if meta.num_rows == 0:  # Spark writes an empty file for an empty DataFrame
            litter.append(f"{root}/{rel}")
            continue
        partition = partition_record(rel, parts, meta)
        df = _compat.data_file_from_parquet_footer(metadata, f"{path}/{rel}", meta, size, partition)
        out.append(data_file_to_json(df, spec_id))
    for p in litter:
        try:
            filesystem.delete_file(p)
        except Exception:  # an orphan of the epoch: swept after its commit
            pass
    return out


def partition_record(rel: str, parts: list[Part], footer: Any) -> tuple[Any, ...]:
    """The partition values of the file at ``rel`` (below the write's directory) from its
    ``hidden=value/`` directories, in the order of the spec's fields."""
    dirs = rel.split("/")[:-1]
    hidden = [p for p in parts if p.hidden is not None]
    if len(dirs) != len(hidden):
        raise SinkError(f"unexpected data file {rel!r} written by Spark: not partitioned as asked")
    values: dict[str, Any] = {}
    for p, d in zip(hidden, dirs, strict=True):
        name, sep, raw = d.partition("=")
        if not sep or name != p.hidden:
            raise SinkError(f"unexpected partition directory {d!r} in {rel!r}")
        values[name] = _decode(raw, p.kind)
    record = []
    for p in parts:
        v = None if p.hidden is None else values[p.hidden]
        if p.kind == "str":
            _check_string_value(footer, p.term, v, rel)
        record.append(v)
    return tuple(record)


def _decode(raw: str, kind: str) -> Any:
    if raw == _NULL_DIR:
        return None
    text = _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), raw)
    if kind == "str":
        if not text.startswith("v"):
            raise SinkError(f"unexpected partition directory value {raw!r}")
        return text[1:]
    if kind == "bool":
        return text == "true"
    return int(text)


def _check_string_value(footer: Any, term: PartitionTerm, value: Any, rel: str) -> None:
    """The footer's bounds of the source column must hold ``value`` (a case-insensitive
    filesystem would merge the directories of ``a`` and ``A``)."""
    schema = footer.schema
    idx = next((i for i in range(len(schema)) if schema.column(i).path == term.source), None)
    if idx is None:
        return
    width = term.width if term.transform == "truncate" else None
    for r in range(footer.num_row_groups):
        col = footer.row_group(r).column(idx)
        stats = col.statistics
        if stats is None:
            continue
        if value is None:
            ok = not stats.has_min_max  # a null partition value: only nulls in the file
        elif not stats.has_min_max:
            continue  # no bounds (values too long for Parquet's statistics): nothing to check
        else:
            lo, hi = stats.min, stats.max
            if isinstance(lo, bytes):
                lo, hi = lo.decode(errors="replace"), hi.decode(errors="replace")
            # Bounds may be truncated (a writer setting): a range check, exact when not.
            ok = (lo[:width] if width else lo) <= value <= (hi[:width] if width else hi)
        if not ok:
            raise SinkError(
                f"data file {rel!r}: its values of {term.source!r} do not match its partition "
                f"{term} = {value!r} (a case-insensitive filesystem merges partition "
                "directories); write with writer='python'"
            )

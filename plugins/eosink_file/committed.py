"""Reading what a target holds: the committed files of whole epochs (manifests), and
record counts of staged files for the staged-rows check."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from eosink import (
    ConfigError,
)
from eosink.util import sink_key

from ._hadoop import HadoopStore, spark_session
from ._s3 import S3Store
from .layout import COMMITS_DIR, MARKER_DIR
from .options import URI_SCHEME, FileSinkOptions, file_uri_path

log = logging.getLogger("eosink.file")


_CHUNK = 8 * 1024 * 1024


def _option(options: Mapping[str, str], name: str, default: str) -> str:
    """A Spark writer option (case-insensitive names, as Spark takes them)."""
    for k, v in options.items():
        if k.lower() == name.lower():
            return v
    return default


def _chunks(path: Path) -> Iterable[bytes] | None:
    """The uncompressed bytes of a staged JSON, CSV or text file, by chunks; None for a
    codec this cannot read (a ``compression`` given in ``format_options``)."""
    name = path.name
    if name.endswith((".deflate", ".lz4", ".snappy", ".zst", ".zstd", ".br", ".xz", ".lzo")):
        return None

    def raw() -> Iterable[bytes]:
        with open(path, "rb") as fh:
            while True:
                b = fh.read(_CHUNK)
                if not b:
                    return
                yield b

    if not name.endswith((".gz", ".bz2")):
        return raw()

    def decompressed() -> Iterable[bytes]:
        import bz2
        import zlib

        def new() -> Any:
            return bz2.BZ2Decompressor() if name.endswith(".bz2") else zlib.decompressobj(31)

        d = new()
        for b in raw():
            while b:
                yield d.decompress(b)
                b = d.unused_data if d.eof else b""
                if b:  # a file of several gzip members / bzip2 streams
                    d = new()

    return decompressed()


def _records(path: Path, fmt: str, options: Mapping[str, str]) -> tuple[int | None, bool]:
    """The records of a staged JSON lines, CSV or text file Spark wrote, and whether the
    count is exact (else it is an upper bound: values may contain line breaks).

    JSON lines: one line per row, line breaks inside values escaped: exact. CSV with
    eosink's quoting (quote and escape ``"``): the line breaks outside quoted values, less
    the header: exact. Text, and CSV quoted otherwise: the line breaks.
    """
    chunks = _chunks(path)
    if chunks is None:
        return None, False
    sep = _option(options, "lineSep", "\n").encode()
    if fmt == "json":
        return sum(b.count(sep) for b in chunks), all(c < 0x20 for c in sep)
    if fmt == "text":
        return sum(b.count(sep) for b in chunks), False
    header = 1 if _option(options, "header", "true").lower() == "true" else 0
    quote = _option(options, "quote", '"').encode()
    exact = (
        len(quote) == 1
        and len(sep) == 1
        and _option(options, "escape", '"').encode() == quote
        and _option(options, "escapeQuotes", "true").lower() == "true"
    )
    if not exact:
        lines = sum(b.count(sep) for b in chunks)
        return max(lines - header, 0), False
    n = _outside_quotes(chunks, sep, quote)
    return max(n - header, 0), True


def _outside_quotes(chunks: Iterable[bytes], sep: bytes, quote: bytes) -> int:
    """How many ``sep`` bytes lie outside quoted values (RFC 4180 quoting: a quoted value's
    own quotes are doubled, so quotes come in pairs)."""
    q = re.escape(quote)
    quoted = re.compile(q + b"[^" + q + b"]*" + q)
    n = 0
    carry = b""
    for b in chunks:
        if carry:
            b, carry = carry + b, b""
        if quote not in b:
            n += b.count(sep)
            continue
        if b.count(quote) % 2:  # the chunk ends inside a quoted value: finish it next time
            cut = b.rindex(quote)
            b, carry = b[:cut], b[cut:]
        n += quoted.sub(b"", b).count(sep)
    return n


def count_records(
    paths: Sequence[Path], fmt: str, options: Mapping[str, str]
) -> list[tuple[int | None, bool]]:
    """:func:`_records` of each file (in threads: reading and decompressing release the GIL)."""
    if len(paths) <= 1:
        return [_records(p, fmt, options) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(4, len(paths))) as pool:
        return list(pool.map(lambda p: _records(p, fmt, options), paths))


_MANIFEST_NAME = re.compile(r"\d+(\.roll-[0-9a-f]+-\d+)?\.json")


def committed_files(
    path: str | os.PathLike[str], sink_id: str | None = None, **s3_options: Any
) -> list[str]:
    """The files of every committed epoch under ``path``, by the epochs' manifests.

    A reader that lists the directory during a commit may see some files of the epoch being
    published and not yet the others; a reader that reads the files this returns sees whole
    epochs only (an epoch's manifest is written once all its files are published). With
    rolling options, a file appears once it is rolled (the manifest of the epoch, or of the
    roll between epochs, that published it); rows held in open files are not listed.

    Args:
        path: the sink's directory, its ``s3://bucket/prefix``, or its Hadoop filesystem
            URI (``hdfs://...``: read through the active Spark session's FileSystem).
        sink_id: only this sink's epochs (default: every sink writing to ``path``).
        **s3_options: for an ``s3://`` path, the sink's ``s3_*`` options (endpoint,
            region, credentials); default: boto3's configuration.

    Returns:
        Absolute paths (``s3://`` URLs on S3, URIs on other Hadoop filesystems; a
        ``file://`` sink's are local paths), by epoch, then file name.
    """
    text = str(path)
    if text[:5].lower() == "file:":
        path = file_uri_path(text)
    elif URI_SCHEME.match(text) and not text.startswith("s3://"):
        spark = spark_session()
        if spark is None:
            raise ConfigError(
                f"committed_files({text!r}) reads a Hadoop filesystem through Spark: "
                "call it on a driver with an active (classic) SparkSession"
            )
        fs = HadoopStore(spark, FileSinkOptions.model_validate({"path": text}).path)
        hits: list[tuple[int, str]] = []
        base_rel = f"{MARKER_DIR}/{COMMITS_DIR}"
        keys = [sink_key(sink_id)] if sink_id else fs.names(base_rel)
        for key in keys:
            for name in fs.names(f"{base_rel}/{key}"):
                if _MANIFEST_NAME.fullmatch(name):
                    data = json.loads(fs.read(f"{base_rel}/{key}/{name}") or b"{}")
                    hits += [(int(data["epoch"]), fs.url(f["path"])) for f in data["files"]]
        return [p for _, p in sorted(hits)]
    if str(path).startswith("s3://"):
        store = S3Store(FileSinkOptions(path=str(path), **s3_options))
        base = f"{MARKER_DIR}/{COMMITS_DIR}/"
        prefix = base + (f"{sink_key(sink_id)}/" if sink_id else "")
        found: list[tuple[int, str]] = []
        for rel, _ in store.objects(prefix):
            if _MANIFEST_NAME.fullmatch(rel.rsplit("/", 1)[-1]):
                data = json.loads(store.get(rel))
                found += [(int(data["epoch"]), store.url(f["path"])) for f in data["files"]]
        return [p for _, p in sorted(found)]
    root = Path(path).expanduser().resolve()
    base_dir = root / MARKER_DIR / COMMITS_DIR
    dirs = [base_dir / sink_key(sink_id)] if sink_id else sorted(base_dir.glob("*"))
    out: list[tuple[int, str]] = []
    for d in dirs:
        for m in d.glob("*.json"):
            if not _MANIFEST_NAME.fullmatch(m.name):
                continue
            data = json.loads(m.read_bytes())
            out += [(int(data["epoch"]), str(root / f["path"])) for f in data["files"]]
    return [p for _, p in sorted(out)]
